"""Progress of long loops on stderr: a bar where a person watches, plain lines in a log when asked for.

Output meant for programs (a pipe, a file, ``--json``) must stay exactly what
it is, so progress goes to stderr, and by default only when stderr is a
terminal or the cell output of a Jupyter kernel (notebooks, JupyterLab, VS
Code, Colab), which redraws a line on ``\\r`` as a terminal does: there click
draws a bar (click is already a dependency of the command line). Asked for
(``enabled=True``, what the model-folder commands pass unless ``--quiet``)
where stderr is a pipe or a file, progress is a line per item, at most one
every :data:`LINE_EVERY` seconds, so a log shows work going on rather than a
hang. transformers' own bars (loading weights) follow the same rule through
:func:`library_bars`.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Iterable, Iterator, Sized
from typing import IO, Any, TextIO, TypeVar, cast

import click

T = TypeVar("T")

_CURSOR_CODES = re.compile(r"\033\[\?25[hl]")  # click hides the cursor while drawing; a notebook would show the codes
#: Off a terminal, the least time between two progress lines (the first and the last line are always written).
LINE_EVERY = 5.0
_now = time.monotonic  # the clock of the progress lines (a test sets its own)


def progress(items: Iterable[T], *, label: str, total: int | None = None, enabled: bool | None = None) -> Iterator[T]:
    """Yield items, drawing a bar on stderr when enabled; enabled=None means: a person watches stderr.

    ``total`` is the number of items, for a bar of known length when ``items``
    has no ``len()`` (a generator). With ``enabled=False`` the items pass
    through untouched and nothing is written; ``enabled=True`` off a terminal
    or notebook writes lines instead of a bar (:func:`progress_lines`).
    """
    watched = stderr_is_watched()
    if enabled is None:
        enabled = watched
    if not enabled:
        yield from items
        return
    if not watched:
        yield from progress_lines(items, label=label, total=total)
        return
    stream = cast(TextIO, _NotebookStream(sys.stderr)) if in_notebook() else sys.stderr  # a stream, duck-typed
    with click.progressbar(items, length=total, label=label, file=stream) as bar:
        yield from bar


def progress_lines(items: Iterable[T], *, label: str, total: int | None = None) -> Iterator[T]:
    """Yield items, writing ``label: 3/30 done, 1 min 2 s, about 8 min left`` lines to stderr for a log.

    A line when the loop starts, then one as an item is done, at most one
    every :data:`LINE_EVERY` seconds, and always one for the last item.
    """
    if total is None:
        total = len(items) if isinstance(items, Sized) else None
    start = last = _now()
    _write_line(f"{label}: 0/{total}, started" if total is not None else f"{label}: started")
    for done, item in enumerate(items, 1):
        yield item
        now = _now()
        if now - last >= LINE_EVERY or done == total:
            _write_line(f"{label}: {_count_done(done, total, now - start)}")
            last = now


def _count_done(done: int, total: int | None, elapsed: float) -> str:
    """``3/30 done, 1 min 2 s, about 8 min left`` (the estimate from the mean time per item so far)."""
    if total is None:
        return f"{done} done, {_duration(elapsed)}"
    if done >= total:
        return f"{done}/{total} done, {_duration(elapsed)}"
    return f"{done}/{total} done, {_duration(elapsed)}, about {_duration(elapsed / done * (total - done))} left"


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 7 min``: a duration as a person reads it in a log."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def step(text: str, *, enabled: bool | None = None) -> None:
    """A line on stderr saying what a long run does next (loading, evaluating), where progress is shown."""
    if enabled if enabled is not None else stderr_is_watched():
        _write_line(text)


def _write_line(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def stderr_is_watched() -> bool:
    """Whether a person likely reads stderr as it is written: a terminal or a notebook, not a pipe or a file."""
    return stderr_is_terminal() or in_notebook()


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal (not a pipe or a file)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty is not None and isatty())


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel, whose stderr shows in the notebook.

    Only an IPython already imported is asked (a kernel has imported it), so
    this costs nothing elsewhere. A terminal IPython is no kernel: its stderr
    is the terminal.
    """
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    shell = get_ipython() if callable(get_ipython) else None
    return any(cls.__name__ == "ZMQInteractiveShell" for cls in type(shell).__mro__) if shell is not None else False


class _NotebookStream:
    """A notebook's stderr as click's bar wants it: a terminal (so it draws), without cursor codes."""

    def __init__(self, stream: IO[Any]) -> None:
        self._stream = stream

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return self._stream.write(_CURSOR_CODES.sub("", text))

    def flush(self) -> None:
        self._stream.flush()


@contextlib.contextmanager
def library_bars(enabled: bool | None = None) -> Iterator[None]:
    """Within the block, transformers' progress bars are drawn only where ours would be (``enabled=None``).

    Loading a model draws a bar for its weights on stderr; redirected to a log
    file, that is a line of carriage returns. Off a terminal or notebook the
    bars are switched off for the block and switched back on after it.
    """
    if enabled is None:
        enabled = stderr_is_watched()
    try:
        from transformers.utils import logging as transformers_logging
    except ImportError:  # no transformers, no bars of its own
        yield
        return
    if enabled or not transformers_logging.is_progress_bar_enabled():
        yield
        return
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers_logging.enable_progress_bar()
