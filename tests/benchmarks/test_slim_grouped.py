"""benchmarks/slim_grouped.py: each way's accuracy read at the other's MACs, and the summary over seeds."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "benchmarks"))

import slim_grouped  # noqa: E402  (benchmarks/ is not a package: found through sys.path)


def test_a_curve_is_read_linearly_between_its_points_and_not_outside_them() -> None:
    curve = [(0.2, 0.4), (0.5, 0.7), (0.8, 0.7)]
    assert slim_grouped.at_macs(curve, 0.35) == pytest.approx(0.55)
    assert slim_grouped.at_macs(curve, 0.8) == 0.7
    assert slim_grouped.at_macs(curve, 0.1) is None and slim_grouped.at_macs(curve, 0.9) is None


def _row(seed: int, dense: float, **points: tuple[float, float]) -> dict[str, Any]:
    return {"seed": seed, "dense": dense, **{k.replace("_", "@0."): {"macs_kept": m, "accuracy": a}
                                            for k, (m, a) in points.items()}}  # fmt: skip


def test_the_summary_gives_means_spreads_and_the_other_way_at_equal_macs() -> None:
    points = {"whole_3": (0.6, 0.7), "inside_3": (0.5, 0.6), "whole_5": (0.3, 0.5), "inside_5": (0.2, 0.3),
              "whole_7": (0.1, 0.2), "inside_7": (0.05, 0.1)}  # fmt: skip
    shifted = {key: (macs, accuracy + 0.1) for key, (macs, accuracy) in points.items()}
    lines = slim_grouped.summary([_row(0, 0.8, **points), _row(1, 0.6, **shifted)])
    assert lines[0] == "dense, 100 more steps: 70.0% over 2 seeds"
    assert "| 0.5 | whole | 30.0% | 55.0% (50.0%-60.0%) | 45.0% |" in lines  # inside between 20 % and 50 % of MACs
    assert "| 0.3 | whole | 60.0% | 75.0% (70.0%-80.0%) | - |" in lines  # inside never keeps 60 %
    assert "| 0.5 | inside | 20.0% | 35.0% (30.0%-40.0%) | 40.0% |" in lines
