"""benchmarks/shrink.py still runs: its --quick mode on a tiny model, in its own processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def _quick(tmp_path: Path, *arguments: str) -> list[str]:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "shrink.py"), "--quick", "--threads", "1", "--cache",
         str(tmp_path / "cache"), "--json", str(tmp_path / "runs.json"), *arguments],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return [line for line in completed.stdout.splitlines() if line.startswith("| ")]


@pytest.mark.slow
def test_the_quick_shrink_benchmark_prints_its_tables_and_times_speeds_again_on_request(tmp_path: Path) -> None:
    rows = _quick(tmp_path, "--only", "dense", "flap-mlp50", "magnitude_sp-mlp50")
    assert rows[0].startswith("| configuration | ppl | params | file | shrink time")
    dense, flap = (next(row for row in rows if row.startswith(f"| {name} |")) for name in ("dense", "flap-mlp50"))
    assert dense.endswith("| 1.00x | 1.00x | 1.00x | 1.00x |") and " s |" in flap  # dense is its own speed-up
    assert "| configuration | prefill tok/s f32 | decode tok/s f32 |" in "\n".join(rows)  # rates in their own table
    assert float(flap.split("|")[3].strip().removesuffix(" M")) < float(dense.split("|")[3].strip().removesuffix(" M"))
    assert any(row.startswith("| flap below magnitude_sp at mlp50 |") for row in rows)
    assert any(row.startswith("| flap-mlp50 decodes >= 1.3x dense in float32 |") for row in rows)
    first = json.loads((tmp_path / "runs.json").read_text())
    again = _quick(tmp_path, "--only", "flap-mlp50", "--speeds-again")
    second = json.loads((tmp_path / "runs.json").read_text())
    assert second["flap-mlp50"]["perplexity"] == first["flap-mlp50"]["perplexity"]  # the quality run was kept
    assert second["dense"]["float32"] != first["dense"]["float32"]  # dense timed again beside it
    assert any(row.startswith("| flap-mlp50 |") for row in again)
