"""benchmarks/recover.py still runs: its --quick mode on a tiny model, in its own processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_quick_recovery_benchmark_prints_its_table(tmp_path: Path) -> None:
    rows = [
        "flap-mlp50+refit",
        "block_influence-layers4+replace",
        "oneshot-wanda-50+distill",
        "flap-mlp50+shrink-refit-2steps",
    ]
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "recover.py"), "--quick", "--threads", "1", "--cache",
         str(tmp_path / "cache"), "--json", str(tmp_path / "runs.json"), "--only", *rows],
        check=True, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    lines = [line for line in completed.stdout.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| setting | recovery | ppl | log gap closed")
    for name in ("flap-mlp50 | none", "flap-mlp50 | refit", "block_influence-layers4 | replace"):
        assert any(line.startswith(f"| {name} |") and line.endswith("| yes |") for line in lines), name
    in_shrink = next(line for line in lines if line.startswith("| flap-mlp50 | shrink-refit-2steps |"))
    assert "CPU-s) with shrink, which alone took" in in_shrink and in_shrink.endswith("| yes |")
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert set(runs) == {"dense+none", *rows, *(row.partition("+")[0] + "+none" for row in rows)}
    assert runs["oneshot-wanda-50+distill"]["options"]["max_seconds"] == 5.0
    assert (tmp_path / "cache" / "recover-removed-quick" / "flap-mlp50" / "removal.json").exists()


@pytest.mark.slow
def test_a_trained_method_takes_any_option_the_batch_size_and_a_held_out_play(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "recover.py"), "--quick", "--threads", "1", "--cache",
         str(tmp_path / "cache"), "--json", str(tmp_path / "runs.json"), "--only", "flap-mlp50+blockwise",
         "--option", "lr=0.002", "--batch-size", "2", "--held-out", "macbeth"],
        check=True, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    row = next(line for line in completed.stdout.splitlines() if line.startswith("| flap-mlp50 | blockwise |"))
    assert " (macbeth " in row
    run = json.loads((tmp_path / "runs.json").read_text())["flap-mlp50+blockwise"]
    assert run["options"] == {"epochs": 1, "lr": 0.002, "batch_size": 2}
    assert set(run["held_out"]) == {"macbeth"}
    assert run["notes"] and all(note.endswith("Adam steps at lr 0.002") for note in run["notes"]), run["notes"]
