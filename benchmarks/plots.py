"""Draw the docs' plots from measured data: docs/benchmarks.md's tables and OWL's per-block sparsities.

    python benchmarks/plots.py           # redraw every plot in docs/images/
    python benchmarks/plots.py --check   # exit 1 when a plot is missing

``benchmarks/run.py`` and ``benchmarks/slim.py`` call it after writing
docs/benchmarks.md, and ``benchmarks/llm.py --write-docs`` writes the OWL data
it draws (docs/data/owl.json). Needs matplotlib (``pip install -c constraints.txt -e
".[bench]"``). The SVGs keep their text as text and carry no date, so a redraw
from the same data gives the same file.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchmark_tables import number, tables  # noqa: E402

ROOT = HERE.parent
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
OWL_DATA = ROOT / "docs" / "data" / "owl.json"
IMAGES = ROOT / "docs" / "images"
SPEEDUP = "benchmark-speedup.svg"
MEMORY = "benchmark-memory.svg"
OWL = "owl-block-sparsity.svg"
SLIM = "slim-latency.svg"

_MASK = "compute_mask, amount 0.5"
_SIZES = "compute_mask against tensor size, amount 0.5"
_GLOBAL = "global_unstructured, amount 0.5, weights only"
_SLIM = "Slimming against Torch-Pruning"
TORCH, PRUNEREG = "#9e9e9e", "#1565c0"
_SLIM_COLOURS = {
    "prunereg": PRUNEREG,
    "Torch-Pruning": TORCH,
    "Torch-Pruning, hand-configured": "#ef6c00",
    "Torch-Pruning, hand-configured, attention left alone": "#8d6e63",
}


def _style() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({
        "svg.fonttype": "none",  # text stays text: small files, crisp at any size
        "svg.hashsalt": "prunereg",  # the same ids on every redraw
        "font.size": 10,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.3,
    })  # fmt: skip
    return plt


def _save(figure: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
    figure.clf()
    print(f"wrote {path}", file=sys.stderr)


def _machine(measured: dict[str, list[dict[str, str]]], markdown: str, section: str = _MASK) -> str:
    """What ``section``'s figures were measured on: its own ``Measured ...`` line, else the page's machine table.

    A partial run of benchmarks/run.py rewrites the page's header but only some sections, so each section
    ends with the run that measured it.
    """
    body = next((part for part in re.split(r"\n(?=## )", markdown) if part.startswith(f"## {section}\n")), "")
    own = re.search(r"^Measured (\S+ \S+ UTC) on (.+?), torch uses .*?; torch (\S+); commit (\w+)\.$", body, re.M)
    if own is not None:
        return f"{own[2]}; torch {own[3]}; commit {own[4]}; {own[1]}"
    about = dict(re.findall(r"^\| (cpu|torch|commit) \| (.+?) \|$", markdown, re.MULTILINE))
    cpu = about.get("cpu", "unknown machine").split(", torch uses")[0]
    return f"{cpu}; torch {about.get('torch', '?')}; commit {about.get('commit', '?')}"


def _entries(shape: str) -> int:
    return math.prod(int(side) for side in shape.split("x"))


def _count(value: float) -> str:
    """``256``, ``4K``, ``16.8M``: an axis label for a number of entries."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def speedup_points(measured: dict[str, list[dict[str, str]]]) -> dict[str, list[tuple[float, float]]]:
    """Series of (entries pruned, prunereg's speed-up over torch), from the page's tables."""
    series: dict[str, list[tuple[float, float]]] = {}
    for row in measured.get(_SIZES, []):
        series.setdefault(f"compute_mask, {row['method']}", []).append((int(row["entries"]), number(row["speedup"])))
    for row in measured.get(_MASK, []):  # the 4096 x 4096 case, where no sweep was run
        label = f"compute_mask, {row['method']}"
        if row["method"].startswith("l1_unstructured") and label not in series and row["speedup"] != "-":
            series[label] = [(_entries(row["shape"]), number(row["speedup"]))]
    for row in measured.get(_GLOBAL, []):
        if ", L1, float32" in row["model"] and "compact" not in row["model"] and row["speedup"] != "-":
            entries = number(row["parameters"].rstrip("M")) * 1e6
            series.setdefault("global_unstructured, L1, float32", []).append((entries, number(row["speedup"])))
    return {label: sorted(points) for label, points in series.items()}


def draw_speedup(measured: dict[str, list[dict[str, str]]], markdown: str, path: Path) -> None:
    plt = _style()
    figure, axes = plt.subplots(figsize=(7, 3.8))
    for (label, points), marker in zip(speedup_points(measured).items(), "osD^v"):
        entries, speedups = zip(*points)
        axes.plot(entries, speedups, marker=marker, label=label)
    axes.axhline(1.0, color=TORCH, linestyle="--", linewidth=1)
    axes.text(0.01, 1.0, "torch's speed", transform=axes.get_yaxis_transform(), va="bottom", color="0.4", fontsize=8)
    axes.set(xscale="log", yscale="log", xlabel="entries pruned", ylabel="speed-up over torch")
    axes.set_ylim(bottom=min(0.5, axes.get_ylim()[0]))
    axes.yaxis.set_major_formatter(plt.FuncFormatter(lambda value, _: f"{value:g}x"))
    axes.xaxis.set_major_formatter(plt.FuncFormatter(lambda value, _: _count(value)))
    axes.set_title("prunereg against torch.nn.utils.prune, amount 0.5", loc="left")
    axes.legend(frameon=False, fontsize=9)
    figure.text(0.01, -0.04, f"Measured: {_machine(measured, markdown)} (docs/benchmarks.md)", fontsize=8, color="0.4")
    _save(figure, path)


def memory_rows(measured: dict[str, list[dict[str, str]]]) -> list[tuple[str, float, float]]:
    """(case, torch's peak, prunereg's peak), each in units of the weights' bytes."""
    rows = []
    for row in measured.get(_MASK, []):
        if "unstructured" in row["method"]:
            rows.append((f"compute_mask, {row['method']}", number(row["peak, torch"]), number(row["peak, prunereg"])))
    for row in measured.get(_GLOBAL, []):
        if row["peak, torch"] != "-":
            rows.append((f"global, {row['model']}", number(row["peak, torch"]), number(row["peak, prunereg"])))
    return rows


def draw_memory(measured: dict[str, list[dict[str, str]]], markdown: str, path: Path) -> None:
    plt = _style()
    rows = memory_rows(measured)
    figure, axes = plt.subplots(figsize=(7, 0.42 * len(rows) + 1.2))
    places = range(len(rows))
    axes.barh([p + 0.2 for p in places], [row[1] for row in rows], height=0.38, color=TORCH, label="torch")
    axes.barh([p - 0.2 for p in places], [row[2] for row in rows], height=0.38, color=PRUNEREG, label="prunereg")
    axes.set_yticks(list(places), [row[0] for row in rows], fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel("peak memory above the inputs, in the bytes of the weights pruned")
    axes.set_title("Peak memory while pruning (lower is better)", loc="left")
    axes.grid(axis="y", visible=False)
    axes.legend(frameon=False, loc="lower right")
    figure.text(0.01, -0.02, f"Measured: {_machine(measured, markdown)} (docs/benchmarks.md)", fontsize=8, color="0.4")
    _save(figure, path)


def draw_owl(owl: dict[str, Any], path: Path) -> None:
    plt = _style()
    sparsities, ratios = owl["block_sparsities"], owl["outlier_ratios"]
    blocks = list(range(len(sparsities)))
    figure, axes = plt.subplots(figsize=(7, 3.6))
    outliers = axes.twinx()
    outliers.bar(blocks, ratios, color="#ffcc80", width=0.7, label="outlier ratio (right axis)")
    outliers.set_ylabel("outlier ratio of the block")
    outliers.spines["right"].set_visible(True)
    outliers.grid(False)
    outliers.yaxis.set_major_formatter(plt.FuncFormatter(lambda value, _: f"{value:.1%}"))
    axes.set_zorder(outliers.get_zorder() + 1)  # the lines over the bars
    axes.patch.set_visible(False)
    axes.plot(blocks, sparsities, marker="o", markersize=3, color=PRUNEREG, label="OWL: sparsity of the block")
    target = owl["sparsity"]
    axes.axhline(target, color="0.3", linestyle="--", linewidth=1.2, label=f"uniform: {target:.0%} in every block")
    axes.set(xlabel="decoder block", ylabel="sparsity of the block")
    axes.yaxis.set_major_formatter(plt.FuncFormatter(lambda value, _: f"{value:.0%}"))
    axes.set_title(f"OWL against uniform sparsity: {owl['model']} at {target:.0%}", loc="left")
    handles = [*axes.get_legend_handles_labels()[0], *outliers.get_legend_handles_labels()[0]]
    axes.legend(handles=handles, frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.14), ncol=3)
    note = "Blocks with more outliers are pruned less; the mean stays the target. The same for every method."
    source = f"Calibration: {owl['calibration']}. Data: docs/data/owl.json ({owl['source']})."
    figure.text(0.01, -0.1, f"{note}\n{source}", fontsize=8, color="0.4", va="top")
    _save(figure, path)


def slim_sweeps(measured: dict[str, list[dict[str, str]]]) -> dict[str, dict[str, Any]]:
    """Per model of the slimming sweep: the unslimmed latency (``base``, seconds) and each library's points.

    Read from docs/benchmarks.md's slimming section: the sweep rows (those with
    a ratio and a latency) and the original's row of the main table.
    """
    rows = measured.get(_SLIM, [])
    sweeps: dict[str, dict[str, Any]] = {}
    for row in rows:
        if "ratio" in row and row.get("latency, batch 1", "").endswith("s"):
            model = sweeps.setdefault(row["model"], {"base": None, "tools": {}})
            model["tools"].setdefault(row["library"], []).append((float(row["ratio"]), number(row["latency, batch 1"])))
    for row in rows:
        if row.get("library") == "original" and row.get("model") in sweeps and "ratio" not in row:
            sweeps[row["model"]]["base"] = number(row["latency, batch 1"])
    return sweeps


def _slim_machine(markdown: str) -> str:
    """The slimming section's own ``Measured on ...`` line, up to the Python version."""
    found = re.search(r"^Measured on (.+?); Python", markdown, re.MULTILINE)
    return found.group(1) if found else "unknown machine"


def draw_slim_latency(measured: dict[str, list[dict[str, str]]], markdown: str, path: Path) -> None:
    """Latency at batch 1 against the slimming ratio, a panel per model, one legend below them all."""
    plt = _style()
    sweeps = slim_sweeps(measured)
    figure, panels = plt.subplots(1, len(sweeps), figsize=(3.6 * len(sweeps), 3.4), squeeze=False)
    figure.subplots_adjust(wspace=0.35)  # each panel's y label clear of its left neighbour
    handles: dict[str, Any] = {}
    for axes, (model, sweep) in zip(panels[0], sweeps.items()):
        for tool, points in sweep["tools"].items():
            ratios, latencies = zip(*sorted(points))
            (line,) = axes.plot(
                ratios, [latency * 1000 for latency in latencies], marker="o" if tool == "prunereg" else "s",
                color=_SLIM_COLOURS.get(tool, "#6a1b9a"), label=tool,
            )  # fmt: skip
            handles.setdefault(tool, line)
        highest = max([sweep["base"] or 0.0] + [latency for points in sweep["tools"].values() for _, latency in points])
        if sweep["base"]:
            axes.axhline(sweep["base"] * 1000, color="0.5", linestyle="--", linewidth=1)
            axes.text(0.01, sweep["base"] * 1000, "unslimmed", transform=axes.get_yaxis_transform(), va="bottom",
                      fontsize=8)  # fmt: skip
        axes.set(xlabel="ratio (channels removed per group)", ylabel="latency, batch 1 (ms)")
        axes.set_ylim(0, highest * 1000 * 1.15)  # room above the unslimmed line for its label
        axes.set_title(model, loc="left", fontsize=9)
    # One legend for every panel, below them: a panel's own legend spread over its neighbour.
    figure.legend(list(handles.values()), list(handles), loc="upper left", bbox_to_anchor=(0.01, 0.0),
                  frameon=False, fontsize=8, ncol=2)  # fmt: skip
    rows = math.ceil(len(handles) / 2)
    figure.text(0.01, -0.04 - 0.06 * rows, f"Measured: {_slim_machine(markdown)} (docs/benchmarks.md)", fontsize=8,
                color="0.4")  # fmt: skip
    _save(figure, path)


def main(argv: list[str]) -> int:
    wanted = [IMAGES / SPEEDUP, IMAGES / MEMORY, IMAGES / OWL, IMAGES / SLIM]
    if "--check" in argv:
        missing = [str(path.relative_to(ROOT)) for path in wanted if not path.is_file()]
        print("\n".join(f"missing: {path}" for path in missing), file=sys.stderr)
        return 1 if missing else 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print('the plots need matplotlib: pip install -c constraints.txt -e ".[bench]"', file=sys.stderr)
        return 1
    markdown = BENCHMARKS.read_text()
    measured = tables(markdown)
    draw_speedup(measured, markdown, IMAGES / SPEEDUP)
    draw_memory(measured, markdown, IMAGES / MEMORY)
    if slim_sweeps(measured):
        draw_slim_latency(measured, markdown, IMAGES / SLIM)
    if OWL_DATA.is_file():
        draw_owl(json.loads(OWL_DATA.read_text()), IMAGES / OWL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
