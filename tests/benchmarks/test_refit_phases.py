"""benchmarks/refit_phases.py: where refit's time goes in shrinking's pass, as docs/shrinking.md's table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prunereg._recover.data import RecoveryBlock
from prunereg._runtime.least_squares import LeastSquares

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "benchmarks"))

import refit_phases  # noqa: E402  (benchmarks/ is not a package: found through sys.path)

pytest.importorskip("transformers")


def test_a_row_splits_refits_extra_into_the_passes_the_normal_equations_and_the_rest() -> None:
    seconds = {"shrink": 20.0, "with refit": 50.0, "passes": 24.0, "normal equations": 9.0}
    assert refit_phases.row("mlp 0.5", seconds) == "| mlp 0.5 | 20.0 | 30.0 (1.50x) | 15.0 | 9.0 | 6.0 |"


def test_a_quick_run_times_every_phase_of_each_setting_and_puts_the_engine_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    methods = (RecoveryBlock.normal_equations, LeastSquares.fold)
    assert refit_phases.main(["--quick"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0] == refit_phases.HEADER and len(rows) == 2 + len(refit_phases.SETTINGS)
    for line, name in zip(rows[2:], refit_phases.SETTINGS, strict=True):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[0] == name and all(float(cell.split()[0]) >= 0 for cell in (cells[1], cells[3], cells[4]))
    assert (RecoveryBlock.normal_equations, LeastSquares.fold) == methods


def test_the_wrapped_steps_run_inside_the_shrink_with_refit() -> None:
    import shrink

    model, calibration, _ = shrink.quick_data()
    seconds = refit_phases.measure(model, calibration, {"mlp": 0.5})
    assert seconds["with refit"] > seconds["passes"] > seconds["normal equations"] > 0
