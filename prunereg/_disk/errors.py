"""The error for model files that cannot be read or written, and how a path is shown in it."""

from __future__ import annotations

from prunereg._text import quoted

__all__ = ["CheckpointError", "quoted"]


class CheckpointError(Exception):
    """A model file cannot be read or written: missing, truncated, of unknown format, unsafe."""
