"""Running a plugin's code so that nothing it does can end, silence or corrupt the program.

Plugin code runs when a plugin is imported, when its hook is called, when a
method's module is imported on first use, and whenever a method runs: its
constructor, ``compute_mask`` (mask methods) and ``prune_group`` (calibrated
methods), from every command and every Python path (``apply``, ``prune_file``,
global pruning, ``oneshot``). Around each, :func:`plugin_code` gives the plugin
a stdout and a stderr of its own, both writing to stderr (stdout belongs to the
program: a ``--json`` listing must stay JSON), which it may close or rewrap
without touching the program's own streams. At load time the caller treats
every exception in :data:`PLUGIN_FAILURES` as the plugin failing; at run time
:func:`guard_plugin_methods` turns ``sys.exit()`` and a ``KeyboardInterrupt``
raised by a method into :class:`PluginCodeError`, an ordinary exception. Ctrl-C
pressed by the user meanwhile is a :class:`UserInterrupt`: it still stops the
program.
"""

from __future__ import annotations

import contextlib
import functools
import io
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

PLUGIN_FAILURES = (Exception, SystemExit, KeyboardInterrupt)
"""What a failing plugin may raise; the caller catches ``UserInterrupt`` first and lets it through."""

TRUSTED_PACKAGES = frozenset({"prunereg", "prunereg_builtins", "prunereg_llm"})
"""prunereg's own code, shipped in its distribution: its methods run without a guard."""


class UserInterrupt(KeyboardInterrupt):
    """Ctrl-C pressed while plugin code ran: the user stopping the program, not a plugin failing."""


class PluginCodeError(RuntimeError):
    """A method tried to end the program (``sys.exit()``, ``SystemExit``, a ``KeyboardInterrupt`` of its own)."""


@contextlib.contextmanager
def plugin_code() -> Iterator[None]:
    """Run plugin code with its output sent to stderr and the user's Ctrl-C told apart from the plugin's."""
    stream = _plugin_stream()
    try:
        with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream), _mark_user_interrupts():
            yield
    finally:
        with contextlib.suppress(Exception):  # the plugin may have closed it: the next run makes a new one
            stream.flush()


def guard_plugin_methods(cls: type, names: Iterable[str]) -> None:
    """Run the methods ``names`` that ``cls`` itself defines as plugin code, unless ``cls`` is prunereg's own.

    Called when a method class is defined (``__init_subclass__`` of the
    contracts), so every call is guarded, whichever path makes it.
    """
    if cls.__module__.partition(".")[0] in TRUSTED_PACKAGES:
        return
    for name in names:
        function = cls.__dict__.get(name)
        if isinstance(function, types.FunctionType) and not getattr(function, "_prunereg_guarded", False):
            setattr(cls, name, _guarded(cls, name, function))


def _guarded(cls: type, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    where = f"{cls.__module__}.{cls.__qualname__}.{name}"

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            with plugin_code():
                return function(*args, **kwargs)
        except UserInterrupt:
            raise
        except SystemExit as exiting:
            raise PluginCodeError(
                f"{where} called sys.exit({exiting.code!r}); a method must raise an exception to fail"
            ) from None
        except KeyboardInterrupt:
            raise PluginCodeError(
                f"{where} raised KeyboardInterrupt itself (no Ctrl-C was pressed); a method must raise an "
                "exception to fail"
            ) from None

    run._prunereg_guarded = True  # type: ignore[attr-defined]
    return run


class _PluginStream(threading.local):
    """The stream plugin code writes to in this thread, and the stderr it duplicates."""

    stream: TextIO | None = None
    owner: TextIO | None = None


_plugin = _PluginStream()


def _plugin_stream() -> TextIO:
    """Stderr through a file object of the plugin's own, so that closing or rewrapping it harms nothing else.

    Where stderr has no file descriptor (a test runner's capture, a notebook),
    it is ``sys.stderr`` itself.
    """
    current = sys.stderr
    if current is None:
        return io.StringIO()
    cached = _plugin.stream
    if cached is not None and current is cached:  # plugin code calling into plugin code
        return cached
    if cached is not None and not cached.closed and _plugin.owner is current:
        with contextlib.suppress(Exception):
            sys.stderr.flush()  # what the program wrote comes first
        return cached
    try:
        source = current.fileno()
        current.flush()
    except (AttributeError, OSError, ValueError):
        return current
    stream = open(  # noqa: SIM115  # kept for the next plugin call; it never closes stderr's descriptor
        source,
        "w",
        encoding=getattr(current, "encoding", None) or "utf-8",
        errors="backslashreplace",
        buffering=1,
        closefd=False,
    )
    _plugin.stream, _plugin.owner = stream, current
    return stream


@contextlib.contextmanager
def _mark_user_interrupts() -> Iterator[None]:
    """While Python's own SIGINT handler is installed, make Ctrl-C raise :class:`UserInterrupt` instead."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    if not in_main_thread or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield  # signal handlers can only be changed in the main thread; a program's own handler is left alone
        return

    def interrupted(signum: int, frame: types.FrameType | None) -> None:
        raise UserInterrupt

    signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)
