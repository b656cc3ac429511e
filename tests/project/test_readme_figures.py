"""The README's figures are docs/benchmarks.md's (and docs/llm.md's), rounded as the README shows them.

The benchmarks write docs/benchmarks.md (``python benchmarks/run.py``,
``benchmarks/llm.py --write-docs``, ``benchmarks/llm_engine.py``) and the
shrinking table of docs/llm.md (``benchmarks/shrink.py --write-docs``); when a
rerun moves a figure, these tests name the README sentence to update.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("benchmark_tables", ROOT / "benchmarks" / "benchmark_tables.py")
assert _spec is not None and _spec.loader is not None
benchmark_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(benchmark_tables)  # benchmarks/ is a folder of scripts, not a package
tables, number = benchmark_tables.tables, benchmark_tables.number
README = (ROOT / "README.md").read_text()
BENCHMARKS = (ROOT / "docs" / "benchmarks.md").read_text()


MEASURED = tables(BENCHMARKS)
SHRUNK = [row for row in tables((ROOT / "docs" / "llm.md").read_text())["Shrinking, measured"] if "ppl" in row]


def row(section: str, **match: str) -> dict[str, str]:
    rows = [r for r in MEASURED[section] if all(r.get(key) == value for key, value in match.items())]
    assert len(rows) == 1, f"docs/benchmarks.md, {section}: {len(rows)} rows match {match}"
    return rows[0]


def _mask(title: str) -> dict[str, str]:
    return row("compute_mask, amount 0.5", method=title)


def _global(title: str) -> dict[str, str]:
    return row("global_unstructured, amount 0.5, weights only", model=title)


def _forward(weights: str) -> float:
    [found] = [number(r["overhead"]) for r in MEASURED["Forward under torch.no_grad()"] if r["weights"] == weights]
    return found


def _llm_total(configuration: str) -> float:
    return number(row("One-shot pruning of SmolLM2-135M-Instruct", configuration=configuration)["total"])


def _shrunk(configuration: str, column: str) -> float:
    [found] = [number(r[column]) for r in SHRUNK if r["configuration"] == configuration]
    return found


def _engine_ratios() -> list[float]:
    section = MEASURED["One-shot pruning against the references' loop"]
    return [number(r["ratio"]) for r in section if "ratio" in r]  # the default (medium) column: the last "ratio"


L1_FLOAT32 = "12 x Linear(2048, 2048), L1, float32"
L1_100M = "24 x Linear(2048, 2048), L1, float32"
L1_SPEEDUPS = [number(_mask(title)["speedup"]) for title in ("l1_unstructured float32", "l1_unstructured bfloat16")] + [
    number(_global(title)["speedup"]) for title in (L1_FLOAT32, "12 x Linear(2048, 2048), L1, bfloat16", L1_100M)
]

# Each README claim: a pattern whose groups are the figures shown, and the measured values they round.
CLAIMS: list[tuple[str, Callable[[], list[float]]]] = [
    (r"about (\d+)x the weights' bytes at peak", lambda: [number(_global(L1_FLOAT32)["peak, torch"])]),
    (r"no sort on large tensors \(L1: (\d+)x to (\d+)x faster\)", lambda: [min(L1_SPEEDUPS), max(L1_SPEEDUPS)]),
    (r"global pruning streamed \(about (\d+)x\)", lambda: [number(_global(L1_FLOAT32)["peak, prunereg"])]),
    (
        r"4096 x 4096\s+float32 tensor is about (\d+)x faster",
        lambda: [number(_mask("l1_unstructured float32")["speedup"])],
    ),
    (r"100M float32\s+parameters about (\d+)x faster", lambda: [number(_global(L1_100M)["speedup"])]),
    (
        r"at (\d+)x the weights' bytes of peak memory instead of torch's\s+(\d+)x",
        lambda: [number(_global(L1_100M)["peak, prunereg"]), number(_global(L1_100M)["peak, torch"])],
    ),
    (
        r"costs about (\d+) % more than an unpruned one \(torch: (\d+) %\)",
        lambda: [_forward("pruned by prunereg"), _forward("pruned by torch")],
    ),
    (
        r"with Wanda in (\d+) s\s+and with SparseGPT in (\d+) s",
        lambda: [_llm_total("wanda-50"), _llm_total("sparsegpt-50")],
    ),
    (r"about (0\.\d) of the time the reference", lambda: _engine_ratios()),
    (
        r"dense (\d+\.\d\d)\): (\d+\.\d\d) with a\s+quarter of every MLP's channels removed, (\d+\.\d\d) with half",
        lambda: [_shrunk(name, "ppl") for name in ("dense", "flap-mlp25", "flap-mlp50")],
    ),
    (r"which decodes\s+(\d\.\d\d)x faster in float32", lambda: [_shrunk("flap-mlp50", "decode speed-up f32")]),
]


@pytest.mark.parametrize(("pattern", "measured"), CLAIMS, ids=[pattern for pattern, _ in CLAIMS])
def test_the_readme_figure_is_the_measured_one_rounded(pattern: str, measured: Callable[[], list[float]]) -> None:
    match = re.search(pattern, README)
    assert match is not None, f"the README no longer says /{pattern}/: update the claim with the sentence"
    shown = [float(figure) for figure in match.groups()]
    values = measured()
    digits = [len(figure.partition(".")[2]) for figure in match.groups()]
    if len(values) > len(shown):  # one figure standing for several measurements ("about 0.4")
        shown, digits = shown * len(values), digits * len(values)
    rounded = [round(value, places) for value, places in zip(values, digits)]
    assert rounded == shown, f"README shows {shown} where docs/benchmarks.md gives {values}: update the README"


def test_every_measured_figure_in_the_readme_is_checked() -> None:
    """A new ``12x`` or ``31 s`` in the README needs a claim above, so that it cannot drift from the benchmarks."""
    checked = [match.span(group) for pattern, _ in CLAIMS for match in re.finditer(pattern, README)
               for group in range(1, len(match.groups()) + 1)]  # fmt: skip
    figures = [m for m in re.finditer(r"\b\d+(?:\.\d+)?(?=x\b| s\b| % more|\s%\))", README)]
    unchecked = [m.group() for m in figures if not any(start <= m.start() < end for start, end in checked)]
    assert unchecked == [], f"README figures not checked against docs/benchmarks.md: {unchecked}"


def test_tables_reads_the_benchmark_tables() -> None:
    markdown = "# T\n\n## A\n\nintro\n\n| x | y |\n|---|---|\n| 1 | +2.5x |\n\n| z |\n| --- |\n| 3 |\n"
    assert tables(markdown) == {"A": [{"x": "1", "y": "+2.5x"}, {"z": "3"}]}
    assert number("+2.5x") == 2.5 and number("+0.9%") == 0.9 and number("30.7") == 30.7
    assert number("59.9 ms") == pytest.approx(0.0599) and number("1.13 s") == 1.13
