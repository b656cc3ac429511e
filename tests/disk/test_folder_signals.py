"""A signal while the staging folder is made or deleted: acted on once that is done, never leaving half a folder.

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
PROGRAM = """
import os, signal, sys, tempfile
from pathlib import Path
from prunereg._disk.folder import AtomicFolder
from prunereg._disk.signals import cleanup_on_signals

def signalled(real):
    def call(*args, **kwargs):
        result = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return result
    return call

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
        [sys.executable, "-c", DEFAULT_TERMINATION + PROGRAM, str(tmp_path), where],
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert run.returncode == -signal.SIGTERM, run.stderr
    assert os.listdir(tmp_path) == []
