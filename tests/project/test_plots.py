"""The docs' plots: drawn by benchmarks/plots.py from measured data, small, and shown where the docs say."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
MAX_BYTES = 100_000

PAGE = """# Benchmarks

| machine | |
|---|---|
| cpu | Test CPU, 2 cores, torch uses 2 threads |
| torch | 2.13.0+cpu |
| commit | abc1234 |

## compute_mask, amount 0.5

| method | shape | torch | prunereg | speedup | peak, torch | peak, prunereg |
|---|---|---|---|---|---|---|
| l1_unstructured float32 | 4096x4096 | 1.13 s | 59.9 ms | 18.9x | +7.50x | +1.56x |
| ln_structured float32 | 4096x4096 | 20.3 ms | 17.2 ms | 1.2x | +1.00x | +1.00x |

## compute_mask against tensor size, amount 0.5

| method | entries | shape | torch | prunereg | speedup |
|---|---|---|---|---|---|
| l1_unstructured float32 | 256 | 16x16 | 20.0 us | 40.0 us | 0.5x |
| l1_unstructured float32 | 65536 | 256x256 | 3.5 ms | 1.2 ms | 2.9x |

## global_unstructured, amount 0.5, weights only

| model | parameters | torch | prunereg | speedup | peak, torch | peak, prunereg |
|---|---|---|---|---|---|---|
| 12 x Linear(2048, 2048), L1, float32 | 50.3M | 6.86 s | 279.5 ms | 24.5x | +11.75x | +2.03x |
| 60 x Linear(4096, 4096), L1, bfloat16 (1.0B parameters) | 1006.6M | cannot | 7.95 s | - | - | +2.00x |
"""


@pytest.fixture(scope="module")
def plots() -> ModuleType:
    pytest.importorskip("matplotlib", reason="the bench extra draws the plots")
    spec = importlib.util.spec_from_file_location("plots", ROOT / "benchmarks" / "plots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_speedup_series_come_from_the_sweep_and_the_large_cases(plots: ModuleType) -> None:
    measured = plots.tables(PAGE)
    assert plots.speedup_points(measured) == {
        "compute_mask, l1_unstructured float32": [(256, 0.5), (65536, 2.9)],  # the sweep, not the 4096 x 4096 row
        "global_unstructured, L1, float32": [(pytest.approx(50.3e6), 24.5)],
    }
    assert plots.memory_rows(measured) == [
        ("compute_mask, l1_unstructured float32", 7.5, 1.56),
        ("global, 12 x Linear(2048, 2048), L1, float32", 11.75, 2.03),  # the 1B case: torch cannot, no bar
    ]


def test_plots_are_small_text_svgs_that_redraw_the_same(plots: ModuleType, tmp_path: Path) -> None:
    measured = plots.tables(PAGE)
    drawn = []
    for attempt in ("a", "b"):
        plots.draw_speedup(measured, PAGE, tmp_path / f"speedup-{attempt}.svg")
        plots.draw_memory(measured, PAGE, tmp_path / f"memory-{attempt}.svg")
        drawn.append([(tmp_path / f"{name}-{attempt}.svg").read_bytes() for name in ("speedup", "memory")])
    assert drawn[0] == drawn[1]
    speedup, memory = (svg.decode() for svg in drawn[0])
    assert "compute_mask, l1_unstructured float32" in speedup and "Test CPU, 2 cores" in speedup
    assert "global, 12 x Linear(2048, 2048), L1, float32" in memory
    assert max(len(svg) for svg in drawn[0]) < MAX_BYTES


def test_owls_data_keeps_the_target_on_average_and_draws(plots: ModuleType, tmp_path: Path) -> None:
    owl = json.loads(plots.OWL_DATA.read_text())
    sparsities = owl["block_sparsities"]
    assert len(sparsities) == len(owl["outlier_ratios"]) == 30  # SmolLM2-135M's decoder blocks
    assert sum(sparsities) / len(sparsities) == pytest.approx(owl["sparsity"])
    assert max(sparsities) - min(sparsities) > 0.05  # OWL moved the blocks away from uniform
    half = len(sparsities) // 2  # docs/llm.md: the early blocks are pruned hardest
    assert sum(sparsities[:half]) > sum(sparsities[half:])
    plots.draw_owl(owl, tmp_path / "owl.svg")
    assert "OWL against uniform sparsity" in (tmp_path / "owl.svg").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_plot_a_page_shows_is_a_small_file(page: Path) -> None:
    for target in _IMAGE.findall(page.read_text()):
        image = (page.parent / target).resolve()
        assert image.is_file(), f"{page.name} shows missing {target}"
        assert image.stat().st_size < MAX_BYTES, f"{target} is {image.stat().st_size} bytes"


def test_every_plot_is_shown_somewhere_and_none_is_missing() -> None:
    shown = {Path(target).name for page in PAGES for target in _IMAGE.findall(page.read_text())}
    drawn = {path.name for path in (ROOT / "docs" / "images").glob("*.svg")}
    assert drawn and drawn <= shown
    check = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plots.py"), "--check"], capture_output=True)
    assert check.returncode == 0, check.stderr.decode()


SLIM_PAGE = """# Benchmarks

## Slimming against Torch-Pruning

<!-- slim -->
| model | library | parameters | MACs | latency, batch 1 | speed-up |
|---|---|---|---|---|---|
| Net A | original | 1.00M (100%) | 1.00G | 60.0 ms | - |
| Net A | prunereg | 0.30M (30%) | 0.30G | 30.0 ms | x2.00 |
| Net B | original | 2.00M (100%) | 2.00G | 200.0 ms | - |

| model | library | ratio | parameters | latency, batch 1 | speed-up |
|---|---|---|---|---|---|
| Net A | prunereg | 0.1 | 0.90M | 55.0 ms | x1.09 |
| Net A | prunereg | 0.5 | 0.30M | 30.0 ms | x2.00 |
| Net A | Torch-Pruning | 0.5 | 0.30M | 33.0 ms | x1.82 |
| Net B | prunereg | 0.5 | 0.60M | 100.0 ms | x2.00 |
| Net B | Torch-Pruning, hand-configured, attention left alone | 0.5 | 1.20M | 150.0 ms | x1.33 |
| Net B | Torch-Pruning, hand-configured | 0.5 | failed: `SlimTimeout` | | |

Measured on Test CPU, 2 cores, 2 threads; torch 2.13.0+cpu; Python 3.11.7; 2026-11-27 17:14 UTC. Reproduce: `x`.
<!-- /slim -->
"""


def test_the_slimming_sweep_is_read_from_the_page(plots: ModuleType) -> None:
    assert plots.slim_sweeps(plots.tables(SLIM_PAGE)) == {
        "Net A": {
            "base": pytest.approx(0.06),
            "tools": {"prunereg": [(0.1, pytest.approx(0.055)), (0.5, 0.03)], "Torch-Pruning": [(0.5, 0.033)]},
        },
        "Net B": {
            "base": 0.2,
            "tools": {"prunereg": [(0.5, 0.1)], "Torch-Pruning, hand-configured, attention left alone": [(0.5, 0.15)]},
        },
    }


def test_the_slimming_plot_has_one_legend_below_its_panels(
    plots: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A legend per panel spread over the next panel (docs/images/slim-latency.svg): one legend for the figure."""
    drawn = []
    save = plots._save

    def keep(figure: Any, path: Path) -> None:
        figure.canvas.draw()
        legends = [axes.get_legend() for axes in figure.axes]
        bottom = min(axes.get_window_extent().y0 for axes in figure.axes)
        drawn.append(
            (len(figure.legends), legends, [legend.get_window_extent().y1 for legend in figure.legends], bottom)
        )
        save(figure, path)

    monkeypatch.setattr(plots, "_save", keep)
    plots.draw_slim_latency(plots.tables(SLIM_PAGE), SLIM_PAGE, tmp_path / "slim.svg")
    [(figure_legends, panel_legends, legend_tops, panels_bottom)] = drawn
    assert figure_legends == 1 and panel_legends == [None, None]
    assert legend_tops[0] < panels_bottom  # below the panels, over none of them
    svg = (tmp_path / "slim.svg").read_text()
    assert svg.count("Torch-Pruning, hand-configured, attention left alone") == 1  # once, in the one legend
    assert "Net A" in svg and "Net B" in svg and "Test CPU, 2 cores, 2 threads" in svg
