"""Recovering SmolLM2-135M after shrinking or pruning: how much of the lost perplexity each method gets back.

    python benchmarks/recover.py                              # every row, a table on stdout
    python benchmarks/recover.py --only flap-mlp50+refit      # one row (its setting's "none" row comes along)
    python benchmarks/recover.py --only flap-mlp50+blockwise --epochs 3 --lr 3e-3   # a method's options
    python benchmarks/recover.py --only flap-mlp50+blockwise --batch-size 1 --held-out macbeth  # choosing
    python benchmarks/recover.py --only flap-mlp70+shrink-refit flap-mlp70+shrink-refit-3steps   # rounds or one
    python benchmarks/recover.py --quick                      # a tiny Llama from a config: checks the script runs

The protocol is ``benchmarks/shrink.py``'s (SmolLM2-135M as float32, calibration
on the first 64 x 256 tokens of Coriolanus, perplexity on the first 16 x 512
tokens of Hamlet; data and helpers from ``benchmarks/llm.py``). Each row runs in
a fresh process with ``torch.set_num_threads(2)``: the model is shrunk (or
pruned) as in the shrink table, a copy of it taken before is the teacher, and
``prunereg.recover`` runs with the row's method. The row reports the
perplexity, the share of the log-perplexity gap to the dense model closed
(``(log ppl_none - log ppl) / (log ppl_none - log ppl_dense)``), the time and
peak resident memory of the recovery alone, and whether the saved model
reloads with stock ``transformers`` to the same logits. ``distill`` trains for
a budget of seconds and records the perplexity along the way: its
tokens-to-perplexity curve. The ``shrink-refit`` rows time ``prunereg.shrink(...,
recover="refit", steps=k)`` from the dense model beside a plain shrink of
another copy (both in their CPU-seconds): refit in shrinking's own pass, in one
round or several.

``--held-out PLAY`` also measures each row's perplexity on another play of the
sdist (cut as Hamlet is): settings are chosen there, so that Hamlet stays a
test set. ``--option KEY=VALUE`` (a JSON value, or a string) is any option of a
trained method, ``--batch-size`` the recovery's calibration samples per step.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llm  # benchmarks/llm.py: the data, the model, the table helpers
import memory  # benchmarks/memory.py
import shrink  # benchmarks/shrink.py: the tiny model of --quick, keeping a model in a folder

THREADS = llm.THREADS
DISTILL_SECONDS = 600.0


@dataclass(frozen=True)
class Setting:
    """What is removed before recovery: a shrink method and its settings, or one-shot Wanda (``method="oneshot"``)."""

    name: str
    method: str | None
    removes: dict[str, Any] = field(default_factory=dict)

    @property
    def depth(self) -> bool:
        return "layers" in self.removes


SETTINGS = [
    Setting("dense", None),
    Setting("flap-mlp25", "flap", {"mlp": 0.25}),
    Setting("flap-mlp50", "flap", {"mlp": 0.5}),
    Setting("flap-mlp70", "flap", {"mlp": 0.7}),
    Setting("flap-heads1of3", "flap", {"heads": 1 / 3}),
    Setting("block_influence-layers4", "block_influence", {"layers": 4}),
    Setting("block_influence-layers6", "block_influence", {"layers": 6}),
    Setting("block_influence-layers8", "block_influence", {"layers": 8}),
    Setting("oneshot-wanda-50", "oneshot"),
]
SETTING = {setting.name: setting for setting in SETTINGS}
#: The recovery of each row: a registered method and its options.
METHODS: dict[str, tuple[str | None, dict[str, Any]]] = {
    "none": (None, {}),
    "refit": ("refit", {}),
    "replace": ("replace", {}),
    "blockwise": ("blockwise", {"epochs": 1}),
    "blockwise3": ("blockwise", {"epochs": 3}),
    "distill": ("distill", {"epochs": 1000, "max_seconds": DISTILL_SECONDS}),
}
#: ``prunereg.shrink(..., recover="refit", steps=k)``: refit in shrinking's own pass (in k rounds), timed beside a
#: plain shrink.
IN_SHRINK = {"shrink-refit": 1, "shrink-refit-2steps": 2, "shrink-refit-3steps": 3}
ROWS = [
    f"{setting.name}+{method}"
    for setting in SETTINGS
    if setting.method is not None
    for method in METHODS
    if method != "replace" or setting.depth
] + [
    f"{setting.name}+{method}"
    for setting in SETTINGS
    if setting.method not in (None, "oneshot") and not setting.depth
    for method in IN_SHRINK
]
QUICK_DISTILL_SECONDS = 5.0
#: The methods ``--epochs`` and ``--lr`` apply to.
TRAINED = ("blockwise", "distill")


def remove(model: Any, setting: Setting, calibration: Any) -> dict[str, Any]:
    """Shrink or prune ``model`` as ``setting`` says; what the recovery needs to know (the removed blocks)."""
    import prunereg

    if setting.method == "oneshot":
        prunereg.oneshot(model, "wanda", calibration=calibration, sparsity=0.5, progress=False)
        return {}
    report = prunereg.shrink(model, setting.method, calibration, progress=False, **setting.removes)
    return {"removed_blocks": report.removed_blocks}


def reloads(model: Any, ids: Any) -> bool:
    """Whether ``save_pretrained`` then stock ``AutoModelForCausalLM.from_pretrained`` gives the same logits."""
    import torch
    from transformers import AutoModelForCausalLM

    if getattr(model.config, "quantization_config", None) is not None:  # loaded from GGUF: plain float32 tensors now
        del model.config.quantization_config
        model.hf_quantizer, model.is_quantized = None, False
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            return bool(torch.equal(reloaded(ids[:1, :64]).logits, model(ids[:1, :64]).logits))


def removed_model(dense: Any, setting: Setting, calibration: Any, cache: Path, quick: bool) -> tuple[Any, dict]:
    """``dense`` shrunk or pruned as ``setting`` says, and how (the removed blocks, the seconds it took).

    Kept in the cache: the removal is the same for every method of a setting, and each row then skips it.
    """
    folder = cache / ("recover-removed-quick" if quick else "recover-removed") / setting.name
    about = folder / "removal.json"
    if about.exists():
        return shrink.load_folder(folder), json.loads(about.read_text())
    model = copy.deepcopy(dense)
    start, cpu_start = time.perf_counter(), time.process_time()
    removal = remove(model, setting, calibration)
    removal["seconds"] = time.perf_counter() - start
    removal["cpu_seconds"] = time.process_time() - cpu_start
    shrink.keep_folder(model, folder)
    about.write_text(json.dumps(removal))
    return model, removal


def run_one(
    name: str, cache: Path, threads: int, quick: bool, options: dict[str, Any], settings: dict[str, Any]
) -> dict[str, Any]:
    """One row: remove (or take the removed model from the cache), recover (unless ``none``), measure.

    ``settings``: ``held_out`` (plays measured beside Hamlet) and the recovery's ``batch_size``.
    """
    import torch

    import prunereg

    torch.set_num_threads(threads)
    setting_name, _, method_name = name.partition("+")
    setting = SETTING[setting_name]
    model, calibration, evaluation = shrink.quick_data() if quick else llm.load(cache)
    window = evaluation.shape[1]
    result: dict[str, Any] = {"name": name}
    engine = {"batch_size": settings["batch_size"]} if settings.get("batch_size") else {}
    if method_name in IN_SHRINK:
        model = _in_shrink(model, setting, calibration, IN_SHRINK[method_name], result)
    elif setting.method is not None:
        teacher = model
        model, removal = removed_model(teacher, setting, calibration, cache, quick)
        result["remove_seconds"] = removal["seconds"]
        result["remove_cpu_seconds"] = removal.get("cpu_seconds")
        method, method_options = METHODS[method_name]
        if method is not None:
            if method in TRAINED:
                method_options = {**method_options, **options}
            if quick and method == "distill":
                method_options["max_seconds"] = QUICK_DISTILL_SECONDS
            curve: list[tuple[int, float, float, float]] = []
            instance = _configured(method, method_options, curve, evaluation, window)
            removed = {"removed_blocks": removal.get("removed_blocks") or None}
            memory.trim()
            peak_was_reset = memory.reset_peak()
            start, cpu_start = time.perf_counter(), time.process_time()
            report = prunereg.recover(model, teacher, calibration, instance, progress=False, **removed, **engine)
            result["seconds"] = time.perf_counter() - start - sum(point[2] for point in curve)
            result["cpu_seconds"] = time.process_time() - cpu_start - sum(point[3] for point in curve)
            if peak_was_reset:
                result["peak_rss"] = memory.peak()
            result["undone"] = len(report.undone)
            result["notes"] = [step.note for step in report.steps]
            result["options"] = {key: value for key, value in method_options.items() if key != "callback"} | engine
            if curve:
                result["curve"] = [[tokens, ppl] for tokens, ppl, _, _ in curve]
        del teacher
    result["perplexity"] = prunereg.perplexity(model, evaluation, window=window, batch_size=1)
    plays = settings.get("held_out", [])
    # --quick has no sdist: its one text stands in for every play
    held_out = {play: evaluation if quick else llm.held_out_ids(cache, play) for play in plays}
    result["held_out"] = {
        play: prunereg.perplexity(model, ids, window=window, batch_size=1) for play, ids in held_out.items()
    }
    result["reloads"] = reloads(model, evaluation)
    return result


def _in_shrink(dense: Any, setting: Setting, calibration: Any, steps: int, result: dict[str, Any]) -> Any:
    """A plain shrink and one with ``recover="refit"`` in ``steps`` rounds, each timed on its own copy of ``dense``.

    Returns the latter.
    """
    import prunereg

    for key, recover, rounds in (("remove", None, 1), ("", "refit", steps)):
        model = copy.deepcopy(dense)
        memory.trim()
        peak_was_reset = memory.reset_peak()
        start, cpu_start = time.perf_counter(), time.process_time()
        prunereg.shrink(
            model, setting.method, calibration, progress=False, recover=recover, steps=rounds, **setting.removes
        )
        result[f"{key}_seconds".lstrip("_")] = time.perf_counter() - start
        result[f"{key}_cpu_seconds".lstrip("_")] = time.process_time() - cpu_start
        if recover is not None and peak_was_reset:
            result["peak_rss"] = memory.peak()
    return model


def _configured(
    method: str, options: dict[str, Any], curve: list[tuple[int, float, float, float]], evaluation: Any, window: int
) -> Any:
    """The configured method; ``distill`` also measures the perplexity at 4k, 8k, 16k, ... tokens seen."""
    import prunereg

    if method != "distill":
        return prunereg.get(method)(**options)
    marks = iter(4096 * 2**k for k in range(40))
    state = {"next": next(marks)}

    def measure(tokens: int, model: Any) -> None:
        if tokens < state["next"]:
            return
        start, cpu_start = time.perf_counter(), time.process_time()
        perplexity = prunereg.perplexity(model, evaluation, window=window, batch_size=1)
        curve.append((tokens, perplexity, time.perf_counter() - start, time.process_time() - cpu_start))
        while state["next"] <= tokens:
            state["next"] = next(marks)

    return prunereg.get(method)(**options, callback=measure)


def gap_closed(row: dict[str, Any], none: dict[str, Any] | None, dense: dict[str, Any] | None) -> float | None:
    """The share of the log-perplexity gap between no recovery and the dense model that ``row`` closes."""
    if none is None or dense is None:
        return None
    gap = math.log(none["perplexity"]) - math.log(dense["perplexity"])
    return (math.log(none["perplexity"]) - math.log(row["perplexity"])) / gap if gap > 0 else None


def table(results: dict[str, dict[str, Any]]) -> str:
    """One row per setting and method: perplexity, gap closed, recovery time and peak memory, stock reload."""
    lines = [
        "| setting | recovery | ppl | log gap closed | recovery time (CPU time) | peak RSS while recovering "
        "| stock reload |",
        "|---|---|---|---|---|---|---|",
    ]
    dense = results.get("dense+none")
    for name, row in results.items():
        setting, _, method = name.partition("+")
        closed = gap_closed(row, results.get(f"{setting}+none"), dense) if method != "none" else None
        cells = [
            setting,
            method,
            f"{row['perplexity']:.2f}"
            + "".join(f" ({play} {ppl:.2f})" for play, ppl in row.get("held_out", {}).items()),
            f"{closed:.0%}" if closed is not None else "-",
            _time(row, method),
            f"{row['peak_rss'] / 1e9:.2f} GB" if "peak_rss" in row else "-",
            "yes" if row.get("reloads") else "**no**",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    curves = [
        f"- {name}: " + ", ".join(f"{tokens / 1000:.0f}k tokens {ppl:.2f}" for tokens, ppl in row["curve"])
        for name, row in results.items()
        if row.get("curve")
    ]
    return "\n".join(lines + ([("\nTokens to perplexity (distill):"), *curves] if curves else []))


def _time(row: dict[str, Any], method: str) -> str:
    """The recovery's wall and CPU time; in shrinking's pass, the whole shrink's beside a plain shrink's."""
    if "cpu_seconds" not in row:
        return "-"
    cell = f"{row['seconds']:.0f} s ({row['cpu_seconds']:.0f} CPU-s)"
    if method in IN_SHRINK:
        cell += f" with shrink, which alone took {row['remove_seconds']:.0f} s ({row['remove_cpu_seconds']:.0f} CPU-s)"
    return cell


def in_subprocess(
    name: str, cache: Path, threads: int, quick: bool, options: dict[str, Any], settings: dict[str, Any]
) -> dict[str, Any]:
    """:func:`run_one` in a fresh interpreter, so that each row's peak memory is its own."""
    import subprocess

    command = [sys.executable, __file__, "--one", name, "--cache", str(cache), "--threads", str(threads)]
    command += ["--options", json.dumps(options), "--settings", json.dumps(settings)] + (["--quick"] if quick else [])
    completed = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=ROWS, help="run these rows only (with their settings' none rows)")
    parser.add_argument("--cache", type=Path, default=llm.cache_dir(), help="where the model and texts are kept")
    parser.add_argument("--quick", action="store_true", help="a tiny model from a config")
    parser.add_argument("--json", type=Path, help="keep the raw results here; rows already in it are not rerun")
    parser.add_argument("--threads", type=int, default=THREADS, help="torch threads per row")
    parser.add_argument("--epochs", type=int, help="the method's epochs (blockwise, distill)")
    parser.add_argument("--lr", type=float, help="the method's learning rate (blockwise, distill)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a trained method's option")
    parser.add_argument("--batch-size", type=int, help="the recovery's calibration samples per step [default: 4]")
    parser.add_argument("--held-out", nargs="+", metavar="PLAY", help="also measure on these plays of the sdist")
    parser.add_argument("--settings", type=str, default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--options", type=str, default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--one", choices=[*ROWS, "dense+none"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    options = json.loads(args.options)
    options.update({key: getattr(args, key) for key in ("epochs", "lr") if getattr(args, key) is not None})
    options.update(_option(text) for text in args.option)
    settings = json.loads(args.settings)
    settings.update({key: getattr(args, key) for key in ("batch_size", "held_out") if getattr(args, key) is not None})
    if args.one:
        print(json.dumps(run_one(args.one, args.cache, args.threads, args.quick, options, settings)))
        return
    if not args.quick:
        llm.prepare(args.cache)
    load_before = os.getloadavg()
    results = json.loads(args.json.read_text()) if args.json and args.json.exists() else {}
    wanted = args.only or ROWS
    names = ["dense+none"] + [row for name in wanted for row in (name.partition("+")[0] + "+none", name)]
    for name in dict.fromkeys(names):
        if name not in results:
            results[name] = in_subprocess(name, args.cache, args.threads, args.quick, options, settings)
            print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=2))
    order = ["dense+none", *ROWS]
    ordered = {name: results[name] for name in order if name in results}
    print(f"{table(ordered)}\n\n{llm.machine(load_before, os.getloadavg(), args.threads, 1)}")


def _option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as a key and its JSON value (the text itself where it is not JSON)."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise SystemExit(f"--option takes KEY=VALUE, not {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


if __name__ == "__main__":
    main()
