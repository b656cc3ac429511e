"""benchmarks/ranks.py still runs: its --quick mode on a tiny model, one process and two gloo ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_gloo_available(), reason="needs the gloo backend")
def test_the_quick_ranks_benchmark_prints_every_layout_and_the_ranks_equal_one_process(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ranks.py"), "--quick", "--only", "sparsegpt",
         "--cache", str(tmp_path / "cache"), "--json", str(tmp_path / "runs.json")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    lines = [line for line in completed.stdout.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| method | layout | wall s | peak RSS per rank (MiB) | solves s |")
    rows = {line.split(" | ")[1]: line for line in lines[2:]}
    assert set(rows) == {"1 process, 1 thread", "1 process, 2 threads", "2 ranks, 1 thread each"}
    assert rows["2 ranks, 1 thread each"].split(" | ")[6] == "as 1 thread"  # both ranks: the one process's bits
    assert len(rows["2 ranks, 1 thread each"].split(" | ")[3].split(", ")) == 2  # a peak per rank
    ranks = json.loads((tmp_path / "runs.json").read_text())["sparsegpt"]["2 ranks, 1 thread each"]
    counted = [rank["exchanges"] for rank in ranks]  # each block's statistics and solves, every rank alike
    assert all(each["bytes"] > 0 for each in counted) and counted[0]["exchanges"] == counted[1]["exchanges"] > 0
