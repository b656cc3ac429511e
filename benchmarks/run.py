"""Run prunereg's benchmarks against torch.nn.utils.prune and write docs/benchmarks.md.

    python benchmarks/run.py                 # every case, full sizes (about 10 minutes on 2 cores)
    python benchmarks/run.py --quick         # small sizes: a smoke test, printed, docs left alone
    python benchmarks/run.py --only global   # the cases whose name contains "global"; the page's other sections stay

Every (case, library) pair runs in a fresh Python process, so its peak memory is
its own; prunereg and torch run one after the other on the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import memory  # noqa: E402
import plots  # noqa: E402
from cases import CASES, SMALL_LAYERS, SMALL_STEPS  # noqa: E402

ROOT = HERE.parent
DEFAULT_OUTPUT = ROOT / "docs" / "benchmarks.md"
TIMEOUT = 1800


def run_case(name: str, lib: str, quick: bool) -> dict[str, Any]:
    """One case for one library, in its own process: its result, or why there is none."""
    command = [sys.executable, str(HERE / "cases.py"), name, lib] + (["--quick"] if quick else [])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {TIMEOUT} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return {"error": tail[:200]}


def machine() -> dict[str, str]:
    import torch

    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    total = 0
    with contextlib.suppress(OSError, StopIteration):
        total = (
            int(
                next(
                    line.split()[1]
                    for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("MemTotal:")
                )
            )
            * 1024
        )
    return {
        "cpu": f"{cpu}, {os.cpu_count()} cores, torch uses {torch.get_num_threads()} threads",
        "memory": f"{total / memory.GIB:.1f} GiB",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def load() -> str:
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


# report -----------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.1f} us"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _times(result: dict[str, Any]) -> str:
    return result.get("error") or result.get("skipped") or _seconds(result.get("seconds"))


def _x_weights(result: dict[str, Any], key: str = "peak") -> str:
    if key not in result:
        return "-"
    return f"{result[key] / result['weights']:+.2f}x"


def _speedup(mine: dict[str, Any], theirs: dict[str, Any]) -> float | None:
    if "seconds" in mine and "seconds" in theirs:
        return theirs["seconds"] / mine["seconds"]
    return None


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


def report(
    results: dict[str, dict[str, dict[str, Any]]],
    info: dict[str, str],
    loads: tuple[str, str],
    quick: bool,
    only: Sequence[str] = (),
) -> str:
    lines = [
        "# Benchmarks",
        "",
        "prunereg against `torch.nn.utils.prune`, measured in the same run on the same machine by",
        "",
        "```bash",
        "python benchmarks/run.py" + (" --quick" if quick else "") + "".join(f" --only {part}" for part in only),
        "```",
        "",
        *(
            [
                "The sections that run measured replaced those of the page; the others, and the targets",
                "it did not measure, are from earlier runs: each section ends with the run that measured it.",
                "",
            ]
            if only
            else []
        ),
        "Each (case, library) pair runs in a fresh process. Times are the best of several runs",
        "(global pruning: one run); *peak* is the peak resident memory (VmHWM) above what the",
        "process held once its inputs existed, in units of the bytes of the tensors pruned",
        "(*weights*); *kept* is what is still resident after the call returned, same units.",
        "[performance.md](performance.md) explains where the differences come from.",
        "",
        *(
            ["**--quick: small sizes (the titles name the full ones); a smoke test, not figures.**", ""]
            if quick
            else []
        ),
        "| machine | |",
        "|---|---|",
        *(f"| {key} | {value} |" for key, value in info.items()),
        f"| load average (1/5/15 min) before / after | {loads[0]} / {loads[1]} |",
        "",
    ]
    lines += _targets(results)
    lines += _figures(results)
    for table in (_compute_mask_table, _busy_table, _size_table, _global_table, _forward_table,
                  _small_layers_table, _compile_table, _cli_table):  # fmt: skip
        lines += stamped(table(results), info)
    return "\n".join(lines) + "\n"


def stamped(section: list[str], info: dict[str, str]) -> list[str]:
    """A section with the run that measured it: a partial run (``--only``) replaces some sections and keeps others."""
    if not section:
        return section
    return [*section, f"Measured {info['date']} on {info['cpu']}; torch {info['torch']}; commit {info['commit']}.", ""]


def _section(
    heading: str, columns: list[str], rows: list[str], intro: list[str] = (), notes: list[str] = ()
) -> list[str]:
    """A Markdown section with one table; nothing when there are no rows."""
    if not rows:
        return []
    return [
        f"## {heading}",
        "",
        *intro,
        *([""] if intro else []),
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *rows,
        "",
        *notes,
        *([""] if notes else []),
    ]


def _group(results: dict[str, dict[str, dict[str, Any]]], group: str) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    return [(name, by_lib) for name, by_lib in results.items() if CASES[name].group == group]


def _targets(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    rows = []

    def add(target: str, measured: str, met: bool | None) -> None:
        rows.append(f"| {target} | {measured} | {'yes' if met else 'no' if met is not None else '-'} |")

    for name, by_lib in _group(results, "compute_mask"):
        speed = _speedup(by_lib.get("prunereg", {}), by_lib.get("torch", {}))
        need = 10.0 if "unstructured" in name else 1.0
        measured = _ratio(speed)
        draws = by_lib.get("prunereg", {}).get("draws")
        if draws and "seconds" in by_lib.get("torch", {}):
            measured += f" (torch's own draws alone: {_ratio(by_lib['torch']['seconds'] / draws)})"
        add(
            f"`{CASES[name].title}` compute_mask >= {need:g}x torch's speed",
            measured,
            None if speed is None else speed >= need,
        )
    for name, by_lib in _group(results, "global"):
        mine, theirs = by_lib.get("prunereg", {}), by_lib.get("torch", {})
        speed = _speedup(mine, theirs)
        add(f"global `{CASES[name].title}` >= 10x torch's speed", _ratio(speed), None if speed is None else speed >= 10)
        if "peak" in mine:
            ratio = mine["peak"] / mine["weights"]
            add(f"global `{CASES[name].title}` peak increase <= 3x weights", f"{ratio:.2f}x", ratio <= 3)
    for _name, by_lib in _group(results, "forward"):
        forward = by_lib.get("together", {})
        if "removed" in forward:
            overhead = forward["prunereg"] / forward["removed"] - 1
            add("pruned forward under no_grad within 5 % of the unpruned one", f"{overhead:+.1%}", overhead <= 0.05)
    for name, by_lib in _group(results, "compile"):
        timed = by_lib.get("together", {})
        if name == "compile/forward" and "removed" in timed:
            overhead = timed["prunereg"] / timed["removed"] - 1
            add("compiled pruned forward within 5 % of the compiled unpruned one", f"{overhead:+.1%}", overhead <= 0.05)
        if name == "compile/train_step" and "torch" in timed:
            add(
                "compiled training step within 5 % of torch's pruning",
                f"{timed['torch'] / timed['prunereg']:.2f}x torch's speed",
                timed["prunereg"] <= timed["torch"] * 1.05,
            )
        if "graphs" in timed:
            graphs = timed["graphs"]
            add(
                f"`{name}` compiles no more graphs than torch's pruning",
                f"{graphs['prunereg']} (torch: {graphs['torch']})",
                graphs["prunereg"] <= graphs["torch"],
            )
    for _name, by_lib in _group(results, "small_layers"):
        timed = by_lib.get("together", {})
        for step in SMALL_STEPS:
            if step in timed:
                ours, theirs = timed[step]["prunereg"], timed[step]["torch"]
                add(
                    f"`{step}` on many small layers no slower per call than torch",
                    f"{ours / theirs:.2f}x torch's time",
                    ours <= theirs,
                )
    for name, by_lib in _group(results, "scale"):
        mine = by_lib.get("prunereg", {})
        add(f"`{CASES[name].title}` pruned globally on this machine", _times(mine), "seconds" in mine or None)
    return _section("Targets", ["target", "measured", "met"], rows)


def _compute_mask_table(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    rows = []
    for name, by_lib in _group(results, "compute_mask"):
        mine, theirs = by_lib.get("prunereg", {}), by_lib.get("torch", {})
        shape = "x".join(map(str, mine.get("shape", theirs.get("shape", []))))
        rows.append(
            f"| {CASES[name].title} | {shape} | {_times(theirs)} | {_times(mine)} | "
            f"{_ratio(_speedup(mine, theirs))} | {_x_weights(theirs)} | {_x_weights(mine)} |"
        )
    columns = ["method", "shape", "torch", "prunereg", "speedup", "peak, torch", "peak, prunereg"]
    draws = [
        f"{CASES[name].title}: {_seconds(by_lib['prunereg']['draws'])}"
        for name, by_lib in _group(results, "compute_mask")
        if "draws" in by_lib.get("prunereg", {})
    ]
    notes = (
        [
            "random_unstructured gives torch's masks only by drawing torch's random numbers;",
            f"`torch.rand_like` alone takes {'; '.join(draws)}. torch's time divided by that",
            "is the highest speedup any implementation that keeps torch's masks can reach",
            '("own draws alone" in the targets above).',
        ]
        if draws
        else []
    )
    return _section("compute_mask, amount 0.5", columns, rows, notes=notes)


def _figures(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """The plots benchmarks/plots.py draws from this page's tables, once they exist."""
    if not any(CASES[name].group in ("compute_mask", "global", "sizes") for name in results):
        return []
    return [
        "## At a glance",
        "",
        f"![prunereg's speed-up over torch against the number of entries pruned](images/{plots.SPEEDUP})",
        "",
        f"![peak memory while pruning, torch and prunereg, in the weights' bytes](images/{plots.MEMORY})",
        "",
        "Drawn by `python benchmarks/plots.py` from the tables below (`benchmarks/run.py` runs it).",
        "",
    ]


def _busy_table(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    rows = []
    for name, by_lib in _group(results, "busy"):
        timed = by_lib.get("together", {})
        if "busy" not in timed:
            rows.append(f"| {CASES[name].title} | {_times(timed)} | | | |")
            continue
        for lib in ("torch", "prunereg"):
            alone, busy = timed["alone"][lib], timed["busy"][lib]
            rows.append(f"| {CASES[name].title} | {lib} | {_seconds(alone)} | {_seconds(busy)} | {busy / alone:.1f}x |")
        threads, cpus = timed.get("threads"), timed.get("cpus")
        rows.append(
            f"| {CASES[name].title} | speed-up | {_ratio(timed['alone']['torch'] / timed['alone']['prunereg'])} | "
            f"{_ratio(timed['busy']['torch'] / timed['busy']['prunereg'])} | ({threads} threads, {cpus} CPUs) |"
        )
    intro = [
        "Median of interleaved rounds, first alone, then while another process runs `while True: pass`",
        "(one core taken): prunereg's selection must keep its speed-up when the machine is shared.",
    ]
    return _section(
        "compute_mask beside a busy process", ["case", "library", "alone", "busy", "busy / alone"], rows, intro
    )


def _size_table(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    rows = []
    for name, by_lib in _group(results, "sizes"):
        mine, theirs = by_lib.get("prunereg", {}), by_lib.get("torch", {})
        for point, other in zip(mine.get("sizes", []), theirs.get("sizes", [])):
            shape = "x".join(map(str, point["shape"]))
            rows.append(
                f"| {CASES[name].title} | {point['numel']} | {shape} | {_seconds(other['seconds'])} | "
                f"{_seconds(point['seconds'])} | {_ratio(_speedup(point, other))} |"
            )
    intro = ["One call, best of batches of calls (a call on a small tensor takes microseconds)."]
    columns = ["method", "entries", "shape", "torch", "prunereg", "speedup"]
    return _section("compute_mask against tensor size, amount 0.5", columns, rows, intro)


def _global_table(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    rows = []
    for group in ("global", "compact", "scale"):
        for name, by_lib in _group(results, group):
            mine, theirs = by_lib.get("prunereg", {}), by_lib.get("torch", {})
            params = mine.get("params") or theirs.get("params")
            rows.append(
                f"| {CASES[name].title} | {params / 1e6:.1f}M | " if params else f"| {CASES[name].title} | - | "
            )
            rows[-1] += (
                f"{_times(theirs) if theirs else 'cannot: see below' if group == 'scale' else '-'} | "
                f"{_times(mine)} | {_ratio(_speedup(mine, theirs))} | {_x_weights(theirs)} | "
                f"{_x_weights(mine)} | {_x_weights(theirs, 'retained')} | {_x_weights(mine, 'retained')} | "
                f"{_x_weights(mine, 'mask_bytes') if 'mask_bytes' in mine else '-'} |"
            )
    bf16 = results.get("global/l1/50M/bfloat16", {}).get("torch", {})
    note = []
    if "peak" in bf16:
        ratio = bf16["peak"] / bf16["weights"]
        note = [
            "torch cannot prune the 1B-parameter bfloat16 stack on a 24 GiB machine: its concatenations",
            f"cost {ratio:.1f}x the weights' bytes at peak on the 50M bfloat16 stack above, so the 2.0 GB of",
            f"1B bfloat16 weights would need about {ratio * 2.0:.0f} GB more, on top of the weights themselves.",
            "",
        ]
    columns = [
        "model",
        "parameters",
        "torch",
        "prunereg",
        "speedup",
        "peak, torch",
        "peak, prunereg",
        "kept, torch",
        "kept, prunereg",
        "masks, prunereg",
    ]
    notes = [
        "*masks* is the bytes of the mask buffers: 1x the weights by default (torch's layout), 0.25x for",
        "float32 with `prunereg.compact_masks()` (bool masks).",
        "",
        *note,
    ]
    return _section("global_unstructured, amount 0.5, weights only", columns, rows, notes=notes)


def _forward_table(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    rows = []
    for name, by_lib in _group(results, "forward"):
        forward = by_lib.get("together", {})
        if "removed" not in forward:
            rows.append(f"| {CASES[name].title} | {_times(forward)} | | |")
            continue
        removed = forward["removed"]
        for label, key in (
            ("pruned by torch", "torch"),
            ("pruned by prunereg", "prunereg"),
            ("after remove", "removed"),
        ):
            rows.append(
                f"| {CASES[name].title} | {label} | {_seconds(forward[key])} | {forward[key] / removed - 1:+.1%} |"
            )
    intro = ["Median of interleaved rounds; *overhead* is against the same model after `remove`."]
    return _section("Forward under torch.no_grad()", ["model", "weights", "forward", "overhead"], rows, intro)


def _small_layers_table(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    rows = []
    for name, by_lib in _group(results, "small_layers"):
        timed = by_lib.get("together", {})
        if "error" in timed:
            rows.append(f"| {CASES[name].title} | {timed['error']} | | | |")
            continue
        for step in SMALL_STEPS:
            if step in timed:
                ours, theirs = timed[step]["prunereg"], timed[step]["torch"]
                rows.append(f"| {step} | {_seconds(theirs)} | {_seconds(ours)} | {ours / theirs:.2f}x |")
    intro = [
        f"{SMALL_LAYERS} `nn.Linear(64, 64)` pruned one by one, as a loop over a model's modules does;",
        "one thread, both libraries in the same process, alternating call by call; median time per call.",
    ]
    columns = ["call", "torch", "prunereg", "prunereg / torch"]
    return _section("Many small layers, one call each", columns, rows, intro)


LABELS = (("pruned by torch", "torch"), ("pruned by prunereg", "prunereg"), ("after remove", "removed"))


def _compile_table(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    rows = []
    for name, by_lib in _group(results, "compile"):
        timed = by_lib.get("together", {})
        if "removed" not in timed:
            rows.append(f"| {CASES[name].title} | {_times(timed)} | | | |")
            continue
        for label, key in LABELS:
            rows.append(
                f"| {CASES[name].title} | {label} | {_seconds(timed[key])} | "
                f"{timed[key] / timed['removed'] - 1:+.1%} | {timed['graphs'][key]} |"
            )
    intro = [
        "`torch.compile` (inductor); median of interleaved rounds after warm-up; *overhead* is against",
        "the same model after `remove`; *graphs* is how many graphs dynamo compiled for it.",
    ]
    return _section("torch.compile", ["case", "weights", "time", "overhead", "graphs"], rows, intro)


def _cli_table(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    rows = []
    for _name, by_lib in _group(results, "cli"):
        for label, seconds in by_lib.get("together", {}).items():
            rows.append(f"| `{label}` | {seconds if isinstance(seconds, str) else _seconds(seconds)} |")
    return _section("Command line (wall time, median)", ["command", "time"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; print the report instead of writing it")
    parser.add_argument("--only", action="append", default=[], help="run the cases whose name contains this")
    parser.add_argument("--output", type=Path, help=f"where to write the report (default {DEFAULT_OUTPUT})")
    args = parser.parse_args()
    names = [n for n in CASES if not args.only or any(part in n for part in args.only)]
    before = load()
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name in names:
        for lib in CASES[name].libs:
            print(f"{name} [{lib}] ...", end=" ", flush=True, file=sys.stderr)
            result = run_case(name, lib, args.quick)
            results.setdefault(name, {})[lib] = result
            print(result.get("error") or result.get("skipped") or "done", file=sys.stderr)
    text = report(results, machine(), (before, load()), args.quick, args.only)
    output = args.output or (None if args.quick else DEFAULT_OUTPUT)
    if output is None:
        print(text)
    elif args.only and output.exists():
        output.write_text(merge(output.read_text(), text))
        print(f"wrote {output} (only the sections this run measured)", file=sys.stderr)
    else:
        kept = sections_written_elsewhere(output.read_text()) if output.exists() else []
        output.write_text("\n".join([text.rstrip("\n"), *kept]) + "\n")
        print(f"wrote {output}", file=sys.stderr)
        if output == DEFAULT_OUTPUT:
            plots.main([])  # the plots of docs/ follow the page they are drawn from


def sections_written_elsewhere(old: str) -> list[str]:
    """The ``## `` sections of ``old`` that another script fills between ``<!-- name -->`` markers.

    benchmarks/llm.py writes its timings into this page too; rewriting the page
    must not drop them.
    """
    sections = re.split(r"\n(?=## )", old)
    return ["\n" + section.rstrip("\n") for section in sections[1:] if re.search(r"<!-- [\w-]+ -->", section)]


def merge(old: str, new: str) -> str:
    """``old`` page with the sections of ``new`` (a partial run's report) put in: what ``--only`` writes.

    A section (``## `` heading) that ``new`` has replaces the one of the same
    heading, in its place; one that ``old`` lacks goes before the sections other
    scripts write (:func:`sections_written_elsewhere`), or last. The targets
    table is merged row by row (keyed by the target): a partial run measures
    only some of them. The header (machine, load) is ``new``'s, which says the
    rest of the page is older; every other section of ``old`` stays as it was.
    """
    _, old_sections = _split_sections(old)
    new_head, new_sections = _split_sections(new)
    fresh = {_heading(section): section for section in new_sections}
    merged = []
    for section in old_sections:
        heading = _heading(section)
        if heading not in fresh:
            merged.append(section)
        elif heading == "## Targets":
            merged.append(_merge_rows(section, fresh.pop(heading)))
        else:
            merged.append(fresh.pop(heading))
    elsewhere = [i for i, section in enumerate(merged) if re.search(r"<!-- [\w-]+ -->", section)]
    at = elsewhere[0] if elsewhere else len(merged)
    merged[at:at] = fresh.values()
    return "\n\n".join([new_head, *merged]) + "\n"


def _split_sections(page: str) -> tuple[str, list[str]]:
    """The text before the first ``## `` heading, and each ``## `` section, without their trailing blank lines."""
    head, *sections = re.split(r"\n(?=## )", page)
    return head.rstrip("\n"), [section.rstrip("\n") for section in sections]


def _heading(section: str) -> str:
    return section.split("\n", 1)[0].rstrip()


def _merge_rows(old: str, new: str) -> str:
    """``old``'s table with each row keyed as one of ``new``'s (first cell) replaced, and ``new``'s other rows after."""
    fresh = {_first_cell(line): line for line in new.splitlines() if _first_cell(line)}
    lines = []
    for line in old.splitlines():
        key = _first_cell(line)
        lines.append(fresh.pop(key) if key in fresh else line)
    last_row = max((i for i, line in enumerate(lines) if _first_cell(line)), default=len(lines) - 1)
    lines[last_row + 1 : last_row + 1] = fresh.values()
    return "\n".join(lines)


def _first_cell(line: str) -> str | None:
    """The first cell of a table row (of its column titles too); None for any other line."""
    return line[2:].split(" | ", 1)[0] if line.startswith("| ") else None


if __name__ == "__main__":
    main()
