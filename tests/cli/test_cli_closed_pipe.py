"""A reader that goes away early (``prunereg list | head -1``) ends a command quietly, as it ends a Unix tool."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prunereg._cli.streams import CLOSED_PIPE_STATUS


@pytest.mark.parametrize("args", [["list"], ["list", "--json"], ["--help"], ["oneshot", "--help"], ["--version"]])
def test_a_closed_pipe_ends_the_command_without_a_traceback(tmp_path: Path, args: list[str]) -> None:
    script = Path(sys.executable).with_name("prunereg")
    read_end, write_end = os.pipe()
    with open(tmp_path / "stderr", "w+") as stderr:
        process = subprocess.Popen([str(script), *args], stdout=write_end, stderr=stderr)
        os.close(write_end)
        os.close(read_end)  # long before the command writes anything: its first write meets a closed pipe
        status = process.wait(timeout=120)
        stderr.seek(0)
        errors = stderr.read()
    assert errors == ""
    assert status == CLOSED_PIPE_STATUS == 141
