"""The benchmark case with a competing busy process runs in a quick run and times both libraries."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_busy_case_times_both_libraries_alone_and_beside_a_busy_process(tmp_path: Path) -> None:
    output = tmp_path / "benchmarks.md"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--only", "busy/", "--output", str(output)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = output.read_text()
    section = report[report.index("## compute_mask beside a busy process") :]
    rows = [line.split("|")[2:6] for line in section.splitlines() if line.startswith("| l1_unstructured float32")]
    labels = [cells[0].strip() for cells in rows]
    assert labels == ["torch", "prunereg", "speed-up"]
    for cell in (cell.strip() for cells in rows[:2] for cell in cells[1:3]):  # alone, busy: timed, in any unit
        assert re.fullmatch(r"[\d.]+ (us|ms|s)", cell), cell
    assert rows[2][1].strip().endswith("x") and rows[2][2].strip().endswith("x")
