"""benchmarks/gradual.py: its report reads its results right and judges the overhead target on the same runs."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "benchmarks"))

import gradual  # noqa: E402  (benchmarks/ is not a package: found through sys.path)


def result(accuracy: float, step: float, pruning: float) -> dict[str, float]:
    return {"accuracy": accuracy, "sparsity": 0.9, "seconds": 3.0, "step": step, "pruning": pruning}


def test_the_report_judges_the_overhead_against_the_same_runs_steps() -> None:
    results = {
        gradual.DENSE: {0.0: {**result(0.97, 0.001, 0.0), "sparsity": 0.0}},
        gradual.AGP: {0.9: result(0.95, 0.002, 0.00006), 0.5: result(0.96, 0.002, 0.00005)},
        gradual.LIGHTNING: {0.9: {"skipped": "Lightning is not installed"}, 0.5: {"skipped": "no"}},
    }
    text = gradual.report(results, gradual.Setting(quick=False), "a test machine", image=None)
    assert "| AGP (prunereg, cubic) | 95.0 % | 90.0 % | 3.00 s | 2.000 ms | 3.0 % |" in text
    assert "**3.00 %, met**" in text  # 0.06 ms of pruning per 2 ms step, not per the dense run's 1 ms
    assert "| Lightning ModelPruning | skipped: Lightning is not installed |" in text
    assert "| AGP (prunereg, cubic) | 96.0 % | 95.0 % |" in text  # the sweep, levels in order
