"""FIFOs in tests: code that would wait forever on one fails the test instead of hanging the suite."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def fifo_unblocker(*fifos: Path) -> Iterator[None]:
    """Open and close each FIFO's writing end whenever a reader waits: a reader that blocked then reads EOF.

    So code that opens a FIFO for reading (and would wait forever) fails the test instead of hanging it.
    """
    stop = threading.Event()

    def unblock() -> None:
        while not stop.wait(0.05):
            for fifo in fifos:
                with contextlib.suppress(OSError):
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
