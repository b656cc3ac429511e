"""A progress bar for long loops, shown where a person watches: a terminal or a notebook.

Output meant for programs (a pipe, a file, ``--json``) must stay exactly what
it is, so the bar is drawn on stderr, and by default only when stderr is a
terminal or the cell output of a Jupyter kernel (notebooks, JupyterLab, VS
Code, Colab), which redraws a line on ``\\r`` as a terminal does. click draws
it: click is already a dependency of the command line. transformers' own bars
(loading weights) follow the same rule through :func:`library_bars`.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any, TextIO, TypeVar, cast

import click

T = TypeVar("T")

_CURSOR_CODES = re.compile(r"\033\[\?25[hl]")  # click hides the cursor while drawing; a notebook would show the codes


def progress(items: Iterable[T], *, label: str, total: int | None = None, enabled: bool | None = None) -> Iterator[T]:
    """Yield items, drawing a bar on stderr when enabled; enabled=None means: a person watches stderr.

    ``total`` is the number of items, for a bar of known length when ``items``
    has no ``len()`` (a generator). With ``enabled=False`` the items pass
    through untouched and nothing is written; ``enabled=True`` off a terminal
    or notebook writes the label once instead of a bar (click's way).
    """
    if enabled is None:
        enabled = stderr_is_watched()
    if not enabled:
        yield from items
        return
    stream = cast(TextIO, _NotebookStream(sys.stderr)) if in_notebook() else sys.stderr  # a stream, duck-typed
    with click.progressbar(items, length=total, label=label, file=stream) as bar:
        yield from bar


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
