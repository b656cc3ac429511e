"""Running a plugin's code so that nothing it does can end, silence or corrupt the program.

Plugin code runs at three moments: importing the plugin, calling its hook, and
importing a method's module on first use. Around each, :func:`plugin_code`
sends what the plugin prints to stderr (stdout belongs to the program: a
``--json`` listing must stay JSON), and the caller treats every exception in
:data:`PLUGIN_FAILURES` as the plugin failing, ``sys.exit()``,
``SystemExit`` and ``KeyboardInterrupt`` raised by the plugin included. Ctrl-C
pressed by the user meanwhile is a :class:`UserInterrupt`: it still stops the
program.
"""

from __future__ import annotations

import contextlib
import io
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

PLUGIN_FAILURES = (Exception, SystemExit, KeyboardInterrupt)
"""What a failing plugin may raise; the caller catches ``UserInterrupt`` first and lets it through."""


class UserInterrupt(KeyboardInterrupt):
    """Ctrl-C pressed while plugin code ran: the user stopping the program, not a plugin failing."""


@contextlib.contextmanager
def plugin_code() -> Iterator[None]:
    """Run plugin code with its stdout sent to stderr and the user's Ctrl-C told apart from the plugin's."""
    with contextlib.redirect_stdout(sys.stderr if sys.stderr is not None else io.StringIO()), _mark_user_interrupts():
        yield


@contextlib.contextmanager
def _mark_user_interrupts() -> Iterator[None]:
    """While Python's own SIGINT handler is installed, make Ctrl-C raise :class:`UserInterrupt` instead."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    if not in_main_thread or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield  # signal handlers can only be changed in the main thread; a program's own handler is left alone
        return

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise UserInterrupt

    signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)
