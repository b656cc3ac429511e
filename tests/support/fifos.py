"""FIFOs in tests: code that would wait forever on one fails the test instead of hanging the suite."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

_UNBLOCK = """
import os, sys, time
while True:
    for fifo in sys.argv[1:]:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    time.sleep(0.05)
"""


@contextlib.contextmanager
def fifo_unblocker(*fifos: Path) -> Iterator[None]:
    """Open and close each FIFO's writing end whenever a reader waits: a reader that blocked then reads EOF.

    So code that opens a FIFO for reading (and would wait forever) fails the test instead of hanging it. The
    writer is another process: a blocked open in native code may hold this one's GIL, which a thread would wait on.
    """
    unblocker = subprocess.Popen([sys.executable, "-c", _UNBLOCK, *map(str, fifos)])
    try:
        yield
    finally:
        unblocker.kill()
        unblocker.wait()
