"""Real processes: concurrent runs on one OUTPUT, and signals during the write.

A run is held between writing its temporary file and putting it in place by
a gate: ``prunereg`` started through a small wrapper whose save, once done,
marks that it has written and waits for the gate file to appear.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from prunereg._files import checkpoint
from tests.support.processes import start_gated, wait_until_marked

pytestmark = pytest.mark.slow

DEFAULT_CTRL_C = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
GATED_PRUNEREG = """
import os, sys, time
from prunereg._files import checkpoint
from prunereg._cli import main

real_save = checkpoint.save

def save_then_wait(*args):
    real_save(*args)
    open(os.environ["PRUNEREG_TEST_WRITTEN"], "w").close()
    while not os.path.exists(os.environ["PRUNEREG_TEST_GATE"]):
        time.sleep(0.01)

checkpoint.save = save_then_wait
main(prog_name="prunereg")
"""
TIMEOUT = 120
SCRIPT = Path(sys.executable).with_name("prunereg")


def _model(directory: Path) -> Path:
    path = directory / "model.pt"
    torch.save({"w": torch.arange(1.0, 65.0).reshape(8, 8), "b": torch.ones(8)}, path)
    return path


def _prune_args(path: Path, output: Path, amount: str) -> list[str]:
    return ["prune", str(path), str(output), "--method", "l1_unstructured", "--amount", amount]


def _start_gated(args: list[str], control: Path, setup: str = "") -> subprocess.Popen[str]:
    """``prunereg`` with ``args`` in a new process that waits after writing OUTPUT; ``setup`` runs first."""
    return start_gated(GATED_PRUNEREG, args, control, setup)


def _wait_until_written(process: subprocess.Popen[str], control: Path) -> None:
    wait_until_marked(process, control, TIMEOUT, "the gated run never wrote its temporary file")


def _zeros(path: Path) -> int:
    return int((checkpoint.read(path).tensors["w"] == 0).sum())


@pytest.fixture
def control(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory for the gate files, apart from the one whose listing the tests check."""
    return tmp_path_factory.mktemp("control")


def test_the_run_that_finishes_second_fails_and_keeps_the_first_output(tmp_path: Path, control: Path) -> None:
    path, output = _model(tmp_path), tmp_path / "out.pt"
    slow = _start_gated(_prune_args(path, output, "0.25"), control)
    try:
        _wait_until_written(slow, control)
        fast = subprocess.run(
            [str(SCRIPT), *_prune_args(path, output, "0.75")], capture_output=True, text=True, timeout=TIMEOUT
        )
        assert fast.returncode == 0, fast.stderr
        (control / "gate").touch()
        stdout, stderr = slow.communicate(timeout=TIMEOUT)
    finally:
        slow.kill()
    assert slow.returncode == 1 and stdout == ""
    assert stderr == f"Error: OUTPUT '{output}' exists; pass --force to replace it\n"
    assert _zeros(output) == 48  # the first finished run's 75 %, not overwritten
    assert sorted(os.listdir(tmp_path)) == ["model.pt", "out.pt"]


def test_concurrent_runs_without_force_leave_one_winner(tmp_path: Path) -> None:
    path, output = _model(tmp_path), tmp_path / "out.pt"
    runs = [
        subprocess.Popen(
            [str(SCRIPT), *_prune_args(path, output, amount)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for amount in ("0.25", "0.5", "0.75", "1.0")
    ]
    results = [(run.wait(timeout=TIMEOUT), *run.communicate()) for run in runs]
    winners = [index for index, (code, _, _) in enumerate(results) if code == 0]
    assert len(winners) == 1, results
    for code, stdout, stderr in (result for index, result in enumerate(results) if index not in winners):
        assert code == 1 and stdout == ""
        assert stderr == f"Error: OUTPUT '{output}' exists; pass --force to replace it\n"
    assert _zeros(output) == [16, 32, 48, 64][winners[0]]
    assert sorted(os.listdir(tmp_path)) == ["model.pt", "out.pt"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("force", [False, True])
def test_a_termination_signal_during_the_write_removes_the_temporary(
    tmp_path: Path, control: Path, signum: signal.Signals, force: bool
) -> None:
    path, output = _model(tmp_path), tmp_path / "out.pt"
    if force:
        output.write_bytes(b"the old output")
    run = _start_gated(_prune_args(path, output, "0.5") + ["--force"] * force, control)
    try:
        _wait_until_written(run, control)
        assert any(name.startswith(".prunereg-") and name.endswith(".tmp") for name in os.listdir(tmp_path))
        run.send_signal(signum)
        run.communicate(timeout=TIMEOUT)
    finally:
        run.kill()
    assert run.returncode == -signum  # the process ends by the signal, as its parent expects
    assert sorted(os.listdir(tmp_path)) == (["model.pt", "out.pt"] if force else ["model.pt"])
    if force:
        assert output.read_bytes() == b"the old output"


def test_ctrl_c_during_the_write_removes_the_temporary(tmp_path: Path, control: Path) -> None:
    path, output = _model(tmp_path), tmp_path / "out.pt"
    # A terminal's Ctrl-C meets Python's own handler; a test run started in the background
    # (where the shell makes children ignore SIGINT) must not change that.
    run = _start_gated(_prune_args(path, output, "0.5"), control, setup=DEFAULT_CTRL_C)
    try:
        _wait_until_written(run, control)
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=TIMEOUT)
    finally:
        run.kill()
    assert run.returncode == 1 and "Aborted" in stderr
    assert os.listdir(tmp_path) == ["model.pt"]


def test_sighup_stays_ignored_under_nohup(tmp_path: Path, control: Path) -> None:
    path, output = _model(tmp_path), tmp_path / "out.pt"
    run = _start_gated(
        _prune_args(path, output, "0.5"), control, setup="import signal; signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
    )
    try:
        _wait_until_written(run, control)
        run.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert run.poll() is None  # ignored, as nohup asked
        (control / "gate").touch()
        _, stderr = run.communicate(timeout=TIMEOUT)
    finally:
        run.kill()
    assert run.returncode == 0, stderr
    assert _zeros(output) == 32
