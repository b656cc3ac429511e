"""Real processes: concurrent ``prunereg oneshot`` runs on one OUTPUT_DIR, and signals while it is written.

A run is held after its first block is pruned (and, with ``--stream``, written)
by a gate: ``prunereg`` started through a small wrapper that marks that it got
there and waits for the gate file to appear.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from tests.support.processes import small_tmpfs, start_gated, wait_until_marked
from tests.support.tiny_lm import random_text, save_tiny_llama_folder

pytestmark = pytest.mark.slow

TIMEOUT = 300
SCRIPT = Path(sys.executable).with_name("prunereg")
DEFAULT_CTRL_C = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
GATED_PRUNEREG = """
import os, time
from prunereg._runtime import streamed, weights
from prunereg._cli import main

def gated(real):
    def done_then_wait(self, index, block, *, pruned):
        real(self, index, block, pruned=pruned)
        if pruned and index == 0:
            open(os.environ["PRUNEREG_TEST_WRITTEN"], "w").close()
            while not os.path.exists(os.environ["PRUNEREG_TEST_GATE"]):
                time.sleep(0.01)
    return done_then_wait

weights.InMemory.done = gated(weights.InMemory.done)
streamed.StreamedBlocks.done = gated(streamed.StreamedBlocks.done)
main(prog_name="prunereg")
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    save_tiny_llama_folder(tmp_path / "dense")
    (tmp_path / "calibration.txt").write_text(random_text(200, seed=1))
    return tmp_path


@pytest.fixture
def control(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory for the gate files, apart from the one whose listing the tests check."""
    return tmp_path_factory.mktemp("control")


def _args(folder: Path, sparsity: str, *extra: str) -> list[str]:
    return [
        "oneshot", str(folder / "dense"), str(folder / "pruned"), "-m", "magnitude", "--sparsity", sparsity,
        "--calibration", str(folder / "calibration.txt"), "--samples", "2", "--seq-len", "16", *extra,
    ]  # fmt: skip


def _zeros(output: Path) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(output)
    return (model.get_parameter("model.layers.1.mlp.down_proj.weight") == 0).float().mean().item()


def _start_gated(args: list[str], control: Path, setup: str = "") -> subprocess.Popen[str]:
    return start_gated(GATED_PRUNEREG, args, control, setup)


def _wait_until_pruning(process: subprocess.Popen[str], control: Path) -> None:
    wait_until_marked(process, control, TIMEOUT, "the gated run never pruned its first block")


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_concurrent_runs_without_force_leave_one_winner_and_the_others_say_so(folder: Path) -> None:
    sparsities = ("0.25", "0.5", "0.75")
    runs = [
        subprocess.Popen([str(SCRIPT), *_args(folder, s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for s in sparsities
    ]
    results = [(run.wait(timeout=TIMEOUT), *run.communicate()) for run in runs]
    winners = [index for index, (code, _, _) in enumerate(results) if code == 0]
    assert len(winners) == 1, results
    output = folder / "pruned"
    for index, (code, stdout, stderr) in enumerate(results):
        if index not in winners:
            assert code == 1 and "wrote" not in stdout, stderr
            refusal = f"Error: OUTPUT_DIR '{output}' exists and is not empty; pass --force to replace it"
            assert _last_line(stderr) == refusal
    assert _zeros(output) == float(sparsities[winners[0]])
    assert sorted(os.listdir(folder)) == ["calibration.txt", "dense", "pruned"]


def test_concurrent_runs_with_force_each_replace_the_folder_whole(folder: Path) -> None:
    sparsities = ("0.25", "0.5", "0.75")
    commands = [[str(SCRIPT), *_args(folder, s, *["--stream"] * (i % 2), "--force")] for i, s in enumerate(sparsities)]
    runs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
    results = [(run.wait(timeout=TIMEOUT), *run.communicate()) for run in runs]
    assert [code for code, _, _ in results] == [0, 0, 0], results
    output = folder / "pruned"
    assert _zeros(output) in {float(s) for s in sparsities}
    weights = {p.name for p in output.iterdir() if "safetensors" in p.name}
    assert weights == {"model.safetensors"} or "model.safetensors" not in weights  # one run's files, not a mix
    assert sorted(os.listdir(folder)) == ["calibration.txt", "dense", "pruned"]


# Each pair of the three choices' values, once (4 runs, not the 8 of every combination: each is two real processes).
@pytest.mark.parametrize(
    ("signum", "stream", "force"),
    [
        (signal.SIGTERM, False, False),
        (signal.SIGTERM, True, True),
        (signal.SIGHUP, False, True),
        (signal.SIGHUP, True, False),
    ],
)
def test_a_termination_signal_leaves_no_partial_folder(
    folder: Path, control: Path, signum: signal.Signals, stream: bool, force: bool
) -> None:
    output = folder / "pruned"
    if force:
        output.mkdir()
        (output / "config.json").write_text("the old output")
    run = _start_gated(_args(folder, "0.5", *["--stream"] * stream, *["--force"] * force), control)
    try:
        _wait_until_pruning(run, control)
        run.send_signal(signum)
        run.communicate(timeout=TIMEOUT)
    finally:
        run.kill()
    assert run.returncode == -signum  # the process ends by the signal, as its parent expects
    assert sorted(os.listdir(folder)) == ["calibration.txt", "dense", *["pruned"] * force]
    if force:
        assert os.listdir(output) == ["config.json"] and (output / "config.json").read_text() == "the old output"
    rerun = subprocess.run([str(SCRIPT), *_args(folder, "0.5", "--force")], capture_output=True, timeout=TIMEOUT)
    assert rerun.returncode == 0, rerun.stderr  # nothing blocks the next run


def test_ctrl_c_leaves_no_partial_folder(folder: Path, control: Path) -> None:
    run = _start_gated(_args(folder, "0.5", "--stream"), control, setup=DEFAULT_CTRL_C)
    try:
        _wait_until_pruning(run, control)
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=TIMEOUT)
    finally:
        run.kill()
    assert run.returncode == 1 and "Aborted" in stderr
    assert sorted(os.listdir(folder)) == ["calibration.txt", "dense"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB file system (tmpfs), where the privileges allow mounting one."""
    with small_tmpfs(tmp_path / "small", "64k") as mount_point:
        yield mount_point


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_disk_says_so_before_pruning_and_leaves_nothing(folder: Path, small_disk: Path, stream: bool) -> None:
    output = small_disk / "pruned"
    args = _args(folder, "0.5", *["--stream"] * stream)
    args[2] = str(output)
    done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 1 and done.stdout == ""
    assert _last_line(done.stderr).startswith(f"Error: cannot write OUTPUT_DIR '{output}': the disk is full (")
    assert os.listdir(small_disk) == []
