"""benchmarks/shrink.py still runs: its --quick mode on a tiny model, in its own processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_quick_shrink_benchmark_prints_its_table() -> None:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "shrink.py"), "--quick", "--only", "dense", "flap-mlp50",
         "--threads", "1"],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    rows = [line for line in completed.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| configuration | ppl | params | file | shrink time")
    dense, flap = (next(row for row in rows if row.startswith(f"| {name} |")) for name in ("dense", "flap-mlp50"))
    assert "(1.00x)" in dense and " s |" in flap
    assert float(flap.split("|")[3].strip().removesuffix(" M")) < float(dense.split("|")[3].strip().removesuffix(" M"))
