"""What both output writers share: the temporary names, the permissions a new file gets, and where a path lies.

A temporary output is named ``.prunereg-XXXXXXXX.tmp`` in its target's folder:
short, so that any target name the file system allows works, and on the same
file system, so the final rename is one step.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

TEMPORARY_PREFIX = ".prunereg-"
TEMPORARY_SUFFIX = ".tmp"

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def write_failure(error: OSError, code: int | None = None) -> str:
    """Why a write failed, as the end of a sentence: "the disk is full (...)" or the system's reason."""
    code = error.errno if code is None else code
    if code in DISK_FULL:
        return f"the disk is full ({os.strerror(code)})"
    return error.strerror or str(error)


def umask() -> int:
    """The process's umask, read without changing it for longer than the call."""
    current = os.umask(0)
    os.umask(current)
    return current


def identity(path: Path | str) -> tuple[int, int] | None:
    """``(device, inode)`` of what is at ``path`` (links not followed), or None if nothing is."""
    try:
        status = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def within(inner: Path | str, outer: Path | str) -> bool:
    """Whether ``inner`` is ``outer`` or lies inside it, links resolved."""
    inner_real, outer_real = Path(os.path.realpath(inner)), Path(os.path.realpath(outer))
    return inner_real == outer_real or outer_real in inner_real.parents


def same(a: Path | str, b: Path | str) -> bool:
    """Whether ``a`` and ``b`` name the same place, links resolved."""
    return os.path.realpath(a) == os.path.realpath(b)
