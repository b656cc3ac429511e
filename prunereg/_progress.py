"""A progress bar for long loops, drawn on stderr and only when stderr is a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

import click

T = TypeVar("T")


def progress(items: Iterable[T], *, label: str, total: int | None = None, enabled: bool | None = None) -> Iterator[T]:
    """Yield ``items``, drawing a bar on stderr when enabled (``None``: when stderr is a terminal)."""
    if enabled is None:
        enabled = bool(getattr(sys.stderr, "isatty", lambda: False)())
    if not enabled:
        yield from items
        return
    with click.progressbar(items, length=total, label=label, file=sys.stderr) as bar:
        yield from bar
