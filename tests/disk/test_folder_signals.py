"""A signal while the staging folder or output files are made, placed or deleted: acted on once that is done.

Each case is a real process (the signal ends it), whose ``os`` calls are
patched to send SIGTERM to itself at the worst moment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import DEFAULT_TERMINATION

TIMEOUT = 120
SIGNALLED = """
import os, signal, sys, tempfile
from pathlib import Path
from prunereg._disk.signals import cleanup_on_signals

def signalled(real):
    def call(*args, **kwargs):
        result = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return result
    return call
"""
"""The start of each program: ``signalled(f)`` is ``f`` sending SIGTERM to its own process once it returns."""
PROGRAM = """
from prunereg._disk.folder import AtomicFolder

where = sys.argv[2]
with cleanup_on_signals():
    if where == "made":
        tempfile.mkdtemp = signalled(tempfile.mkdtemp)  # right after the staging folder is made
    with AtomicFolder(Path(sys.argv[1]) / "out") as staging:
        for index in range(20):
            (staging / f"file-{index}").write_text("data")
        if where == "deleted":
            os.unlink = signalled(os.unlink)  # after the first of its files is deleted
            raise ValueError("the run fails")
print("the signal never came")
"""


@pytest.mark.parametrize("where", ["made", "deleted"])
def test_a_signal_while_the_staging_folder_is_made_or_deleted_leaves_nothing(tmp_path: Path, where: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", DEFAULT_TERMINATION + SIGNALLED + PROGRAM, str(tmp_path), where],
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert run.returncode == -signal.SIGTERM, run.stderr
    assert os.listdir(tmp_path) == []


FILES_PROGRAM = """
from prunereg._disk.files import AtomicOutputs

where, folder = sys.argv[2], Path(sys.argv[1])
with cleanup_on_signals():
    if where == "made":
        tempfile.mkstemp = signalled(tempfile.mkstemp)  # right after the first temporary file is made
    with AtomicOutputs(replace=False) as outputs:
        for index in range(5):
            outputs.stage("OUTPUT", folder / f"out-{index}", lambda path: Path(path).write_text("data"))
        if where == "placed":
            os.link = signalled(os.link)  # after the first file is put in place
        if where == "removed":
            os.unlink = signalled(os.unlink)  # after the first temporary file is removed
            raise ValueError("the run fails")
print("the signal never came")
"""


@pytest.mark.parametrize(("where", "left"), [("made", []), ("placed", [f"out-{i}" for i in range(5)]), ("removed", [])])
def test_a_signal_while_output_files_are_made_placed_or_removed_leaves_all_or_nothing(
    tmp_path: Path, where: str, left: list[str]
) -> None:
    """It stopped the clean-up halfway: a temporary file, four of them, or one output file of five stayed behind."""
    run = subprocess.run(
        [sys.executable, "-c", DEFAULT_TERMINATION + SIGNALLED + FILES_PROGRAM, str(tmp_path), where],
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert run.returncode == -signal.SIGTERM, run.stderr
    assert sorted(os.listdir(tmp_path)) == left
