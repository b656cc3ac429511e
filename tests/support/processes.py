"""Real processes for the race and signal tests: a prunereg run held at a gate, and a tiny file system.

A gated run is ``python -c PROGRAM ARGS``, where PROGRAM patches prunereg so
that, at the moment a test wants to act (after writing a temporary file,
after pruning a block), it creates the file ``$PRUNEREG_TEST_WRITTEN`` and
waits until ``$PRUNEREG_TEST_GATE`` exists.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, TypeVar

import pytest

DEFAULT_TERMINATION = (
    "import signal\nfor each in (signal.SIGTERM, signal.SIGHUP):\n    signal.signal(each, signal.SIG_DFL)\n"
)
"""Each gated run starts as from a terminal: a test suite started under ``nohup`` would pass SIGHUP on ignored."""


def run_prunereg(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The installed ``prunereg`` script run with ``args`` in a new process, its output captured as text."""
    script = Path(sys.executable).with_name("prunereg")
    return subprocess.run([str(script), *args], capture_output=True, text=True, check=False, timeout=timeout)


def run_example_under_torchrun(
    example: Path, n_ranks: int = 2, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """A docs example run as the docs tell the user to (``torchrun --standalone``), on ``n_ranks`` CPU ranks.

    One thread per rank, CUDA hidden; stdout and stderr together as text.
    """
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n_ranks)]
    return subprocess.run(
        [*torchrun, str(example)],
        env=dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def start_gated(program: str, args: list[str], control: Path, setup: str = "") -> subprocess.Popen[str]:
    """``program`` (prunereg's ``main`` behind a gate) with ``args`` in a new process; ``setup`` runs first.

    SIGTERM and SIGHUP start at their defaults (:data:`DEFAULT_TERMINATION`),
    whatever the test run inherited, before ``setup``. The marker and gate files
    are ``control / "written"`` and ``control / "gate"``.
    """
    environment = {
        **os.environ,
        "PRUNEREG_TEST_WRITTEN": str(control / "written"),
        "PRUNEREG_TEST_GATE": str(control / "gate"),
    }
    return subprocess.Popen(
        [sys.executable, "-c", DEFAULT_TERMINATION + setup + program, *args],
        env=environment,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_until_marked(process: subprocess.Popen[str], control: Path, timeout: float, failure: str) -> None:
    """Wait until the gated ``process`` has reached its gate; fail with ``failure`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (control / "written").exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, failure
        time.sleep(0.02)


@contextlib.contextmanager
def small_tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``"64k"``) mounted at ``mount_point``; the test is skipped where mounting is not allowed."""
    mount_point.mkdir()
    mounted = (
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], capture_output=True)
        if shutil.which("mount")
        else None
    )
    if mounted is None or mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


Launched = TypeVar("Launched")


class Worlds(dict[int, Launched], Generic[Launched]):
    """What a launch of ranks gave, per world size, launched the first time a test asks for that size."""

    def __init__(self, launch_world: Callable[[int], Launched]) -> None:
        super().__init__()
        self._launch_world = launch_world

    def __missing__(self, world_size: int) -> Launched:
        self[world_size] = self._launch_world(world_size)
        return self[world_size]
