"""A progress bar for long loops, shown on a terminal only.

Output meant for programs (a pipe, a file, ``--json``) must stay exactly what
it is, so the bar is drawn on stderr, and by default only when stderr is a
terminal. click draws it: click is already a dependency of the command line.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

import click

T = TypeVar("T")


def progress(items: Iterable[T], *, label: str, total: int | None = None, enabled: bool | None = None) -> Iterator[T]:
    """Yield items, drawing a bar on stderr when enabled; enabled=None means: stderr is a terminal.

    ``total`` is the number of items, for a bar of known length when ``items``
    has no ``len()`` (a generator). With ``enabled=False`` the items pass
    through untouched and nothing is written; ``enabled=True`` off a terminal
    writes the label once instead of a bar (click's way).
    """
    if enabled is None:
        enabled = stderr_is_terminal()
    if not enabled:
        yield from items
        return
    with click.progressbar(items, length=total, label=label, file=sys.stderr) as bar:
        yield from bar


def stderr_is_terminal() -> bool:
    """Whether a person is likely watching stderr (it is a terminal, not a pipe or a file)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty is not None and isatty())
