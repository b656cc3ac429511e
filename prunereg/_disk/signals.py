"""SIGTERM and SIGHUP end a command the way Ctrl-C does: through its clean-up code.

By default these signals end Python at once, so ``finally`` blocks never run
and a half-written temporary file stays on disk. Within :func:`cleanup_on_signals`
they raise :class:`Interrupted` instead; once the block has cleaned up, the
process ends by the same signal, so its parent sees what happened. SIGKILL
cannot be caught: it can leave a temporary file behind.

Clean-up itself must not stop halfway (a staging folder half deleted stays on
disk): :func:`signals_held` holds these signals and Ctrl-C back for the
length of a block and acts on one that came once the block is done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
_HELD = (signal.SIGINT, *SIGNALS)


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


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Run the block with SIGINT, SIGTERM and SIGHUP held back; the first that came is raised once it ends.

    The signal then reaches the handler it would have reached (an
    :class:`Interrupted` within :func:`cleanup_on_signals`, ``KeyboardInterrupt``,
    or the end of the process), after the block, never in the middle of it.
    """
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    arrived: list[int] = []
    held = [each for each in _HELD if signal.getsignal(each) not in (signal.SIG_IGN, None)]
    previous = {each: signal.signal(each, lambda signum, _frame: arrived.append(signum)) for each in held}
    try:
        yield
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)
        if arrived:
            signal.raise_signal(arrived[0])
