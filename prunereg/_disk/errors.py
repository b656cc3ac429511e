"""The error for model files that cannot be read or written, and how a path and a size are shown in it."""

from __future__ import annotations

from prunereg._text import quoted

__all__ = ["CheckpointError", "quoted", "size_text"]


class CheckpointError(Exception):
    """A model file cannot be read or written: missing, truncated, of unknown format, unsafe."""


def size_text(n_bytes: int) -> str:
    """A byte count as people read it: ``"0.4 MB"``, ``"1.25 GB"``."""
    return f"{n_bytes / 1e9:.2f} GB" if n_bytes >= 1e8 else f"{n_bytes / 1e6:.1f} MB"
