"""benchmarks/gradual.py: its report reads its results right and judges the overhead on paired ratios."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "benchmarks"))

import gradual  # noqa: E402  (benchmarks/ is not a package: found through sys.path)


def result(accuracy: float, step: float, pruning: float) -> dict[str, float]:
    return {"accuracy": accuracy, "sparsity": 0.9, "seconds": 3.0, "step": step, "pruning": pruning}


def timed(plain: list[float], masks: list[float]) -> dict[str, object]:
    """An overhead measurement whose medians of steps say the opposite of its paired ratios."""
    return {
        "block": 500,
        "rounds": len(plain),
        "step": {gradual.PLAIN: 0.001, gradual.TORCH_MASKS: 0.004, gradual.GRADUAL: 0.002},
        "ratios": {gradual.PLAIN: sorted(plain), gradual.TORCH_MASKS: sorted(masks)},
        "masks_over_plain": [1.2, 1.25, 1.3],
        "in_pruner": 0.012,
    }


def test_the_report_reads_each_run_and_judges_the_overhead_on_the_median_paired_ratio() -> None:
    results = {
        gradual.DENSE: {0.0: {**result(0.97, 0.001, 0.0), "sparsity": 0.0}},
        gradual.AGP: {0.9: result(0.95, 0.002, 0.00006), 0.5: result(0.96, 0.002, 0.00005)},
        gradual.LIGHTNING: {0.9: {"skipped": "Lightning is not installed"}, 0.5: {"skipped": "no"}},
    }
    overhead = timed(plain=[1.30, 1.22, 1.26, 1.40, 1.24], masks=[1.01, 1.06, 0.99, 1.03, 1.02])
    text = gradual.report(results, overhead, gradual.Setting(quick=False), "a test machine", image=None)
    assert "| AGP (prunereg, cubic) | 95.0 % | 90.0 % | 3.00 s | 2.000 ms | 3.0 % |" in text
    assert "| Lightning ModelPruning | skipped: Lightning is not installed |" in text
    assert "| AGP (prunereg, cubic) | 96.0 % | 95.0 % |" in text  # the sweep, levels in order
    # The medians of the ratios (1.26, 1.02), not the ratios of the median steps (2.0, 0.5).
    assert "| plain model (no masks) | 1.000 ms | +26.0 % (+23.0 % to +35.0 %) | no |" in text
    assert "| torch.nn.utils.prune masks, fixed | 4.000 ms | +2.0 % (+0.0 % to +4.5 %) | yes |" in text
    assert "takes 1.2 %" in text and "alone cost +25.0 % against the plain model" in text


def test_the_overhead_is_timed_in_rounds_that_pair_each_block_with_its_references() -> None:
    generator = torch.Generator().manual_seed(0)
    data = (torch.rand(100, 64, generator=generator), torch.randint(0, 10, (100,), generator=generator))
    setting = gradual.Setting(quick=True)
    setting.every = 2  # blocks of a few steps: the pairing is under test, not the times
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        measured = gradual.overhead(data, setting)  # digits' shapes, without scikit-learn (the bench extra)
    finally:
        torch.set_num_threads(threads)
    assert measured["block"] == gradual.OVERHEAD_PERIODS * setting.every
    assert all(len(ratios) == measured["rounds"] for ratios in measured["ratios"].values())
    assert len(measured["masks_over_plain"]) == measured["rounds"]
    assert 0 < measured["in_pruner"] < 1
