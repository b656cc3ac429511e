"""What splitting one layer's SparseGPT solve by rows among ranks could save: the factorization's share of it.

    python benchmarks/solve_split.py            # the shapes below, a markdown table on stdout
    python benchmarks/solve_split.py --quick    # two small shapes: checks the script runs

Under ``torch.distributed`` prunereg solves each input group of a block on one
rank (docs/distributed.md). A finer split, each rank sweeping a share of a
layer's rows, still needs the whole inverse Cholesky factor of the layer's
Hessian on every rank, and that factor costs ``in^3`` against the sweep's
``rows x in^2``: where ``in`` is the MLP width (``down_proj``) it is most of the
solve. This script measures it on one thread, on random weights and a random
positive definite Hessian: the whole solve (``obs_sweep``, unstructured 50 %),
the factor alone (``upper_cholesky_of_inverse``), and the solve of half the
rows (what each of 2 ranks would run). ``floor``: the share of the solve left
with any number of ranks when only the sweep is split.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from prunereg_llm.sparsegpt import obs_sweep, upper_cholesky_of_inverse

SHAPES = {
    "SmolLM2-135M down_proj": (576, 1536),
    "SmolLM2-135M gate/up (stacked)": (3072, 576),
    "Qwen2.5-0.5B down_proj": (896, 4864),
    "Llama-3.2-1B down_proj": (2048, 8192),
}
"""Rows (``out``) and input columns (``in``) of the layers measured."""
QUICK_SHAPES = {"tiny down_proj": (64, 256), "tiny gate/up": (512, 64)}
REPEATS = 3


def seconds(work: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``work`` over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(rows: int, columns: int, repeats: int) -> dict[str, float]:
    """Seconds of the whole solve, of the factor alone and of half the rows' solve, for one layer's shape."""
    generator = torch.Generator().manual_seed(0)
    samples = torch.randn(2 * columns, columns, generator=generator)
    hessian = samples.t() @ samples / samples.shape[0]
    weight = torch.randn(rows, columns, generator=generator)
    damped = hessian + 0.01 * hessian.diagonal().mean() * torch.eye(columns)

    def solve(share: int) -> object:
        return obs_sweep(weight[:share].clone(), hessian, [share], [0.5], n_m=None, blocksize=128, dampening=0.01)

    return {
        "solve": seconds(lambda: solve(rows), repeats),
        "factor": seconds(lambda: upper_cholesky_of_inverse(damped), repeats),
        "half": seconds(lambda: solve(rows // 2), repeats),
    }


def table(results: dict[str, tuple[tuple[int, int], dict[str, float]]]) -> list[str]:
    rows = [
        "| layer | rows x in | solve | factor (share) | half the rows (share) | floor, any number of ranks |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, ((out, columns), found) in results.items():
        share, half = found["factor"] / found["solve"], found["half"] / found["solve"]
        rows.append(
            f"| {name} | {out} x {columns} | {found['solve']:.2f} s | {found['factor']:.2f} s ({share:.0%}) | "
            f"{found['half']:.2f} s ({half:.0%}) | {min(share, 1.0):.0%} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two tiny shapes, one run each")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    results = {name: (shape, measure(*shape, 1 if args.quick else REPEATS)) for name, shape in shapes.items()}
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
