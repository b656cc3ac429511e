"""SIGTERM and SIGHUP end a command the way Ctrl-C does: through its clean-up code.

By default these signals end Python at once, so ``finally`` blocks never run
and a half-written temporary file stays on disk. Within :func:`cleanup_on_signals`
they raise :class:`Interrupted` instead; once the block has cleaned up, the
process ends by the same signal, so its parent sees what happened. SIGKILL
cannot be caught: it can leave a temporary file behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Interrupted(BaseException):
    """A termination signal arrived; a ``BaseException``, like ``KeyboardInterrupt``, so no handler swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def _raise_interrupted(signum: int, _frame: FrameType | None) -> None:
    for each in SIGNALS:  # the clean-up itself must not be interrupted again (restored afterwards)
        signal.signal(each, signal.SIG_IGN)
    raise Interrupted(signum)


@contextlib.contextmanager
def cleanup_on_signals() -> Iterator[None]:
    """Run the block with SIGTERM and SIGHUP raising :class:`Interrupted`, then die of the signal that came."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    ignored = {each for each in SIGNALS if signal.getsignal(each) is signal.SIG_IGN}  # under nohup, say
    previous = {each: signal.signal(each, _raise_interrupted) for each in SIGNALS if each not in ignored}
    try:
        yield
    except Interrupted as interrupted:
        signal.signal(interrupted.signum, signal.SIG_DFL)
        os.kill(os.getpid(), interrupted.signum)
        raise  # only reached where the default action does not end the process
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)
