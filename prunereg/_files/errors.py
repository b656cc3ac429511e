"""The error for model files that cannot be read or written, and how a path is shown in it."""

from __future__ import annotations

import os


class CheckpointError(Exception):
    """A model file cannot be read or written: missing, truncated, of unknown format, unsafe."""


def quoted(path: str | os.PathLike[str]) -> str:
    """``path`` in quotes for a one-line message, with newlines and other control characters escaped."""
    return repr(os.fspath(path))
