"""benchmarks/solve_split.py: the factorization's share of one layer's SparseGPT solve, as a table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from prunereg_llm.sparsegpt import obs_sweep

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "benchmarks"))

import solve_split  # noqa: E402  (benchmarks/ is not a package: found through sys.path)


def test_a_row_gives_each_part_as_a_share_of_the_whole_solve() -> None:
    rows = solve_split.table({"down": ((576, 1536), {"solve": 2.0, "factor": 1.5, "half": 1.8})})
    assert rows[-1] == "| down | 576 x 1536 | 2.00 s | 1.50 s (75%) | 1.80 s (90%) | 75% |"


def test_a_quick_run_measures_every_part_of_each_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert solve_split.main(["--quick"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 2 + len(solve_split.QUICK_SHAPES)
    for row, (name, (out, columns)) in zip(rows[2:], solve_split.QUICK_SHAPES.items(), strict=True):
        assert row.startswith(f"| {name} | {out} x {columns} | ")


def test_half_the_rows_solved_alone_are_the_whole_solves_rows() -> None:
    # docs/distributed.md's claim that a row split keeps the bits (N:M: each row's mask is its own)
    generator = torch.Generator().manual_seed(0)
    samples = torch.randn(512, 256, generator=generator)
    hessian = samples.t() @ samples / 512
    weight = torch.randn(96, 256, generator=generator)

    def solve(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return obs_sweep(rows.clone(), hessian, [rows.shape[0]], [0.5], n_m=(2, 4), blocksize=128, dampening=0.01)

    whole, mask = solve(weight)
    for cut in (37, 64):
        first, second = solve(weight[:cut]), solve(weight[cut:])
        assert torch.equal(torch.cat([first[0], second[0]]), whole) and torch.equal(
            torch.cat([first[1], second[1]]), mask
        )
