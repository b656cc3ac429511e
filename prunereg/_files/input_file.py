"""Model files are opened only when they are regular files.

A FIFO as input would block ``open()`` forever and a device would never end,
so anything but a regular file is refused before a byte is read, in one line
that says what the path is (missing, a symlink loop, a directory, a FIFO...).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from prunereg._disk.errors import CheckpointError, quoted

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}
_NONBLOCKING = getattr(os, "O_NONBLOCK", 0)  # opening a FIFO this way returns at once, so fstat can refuse it


def open_regular(path: Path, what: str = "model file") -> BinaryIO:
    """``path`` opened for binary reading, or :class:`CheckpointError` unless it is a regular file.

    ``what`` names the file the caller expects in the refusal ("give the model file itself").
    """
    _refuse_unless_regular(path, _status(path), what)
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCKING | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    except OSError as error:
        raise CheckpointError(_cannot_open(path, error)) from error
    try:  # the path may have been swapped for something else since the first look
        _refuse_unless_regular(path, os.fstat(fd), what)
        if _NONBLOCKING:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def check_regular(path: Path) -> None:
    """Raise :class:`CheckpointError` unless ``path`` is a regular file (or a symlink to one)."""
    _refuse_unless_regular(path, _status(path))


def _status(path: Path) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as error:
        raise CheckpointError(_cannot_open(path, error)) from error


def _refuse_unless_regular(path: Path, status: os.stat_result, what: str = "model file") -> None:
    if stat.S_ISREG(status.st_mode):
        return
    kind = _KINDS.get(stat.S_IFMT(status.st_mode), "not a regular file")
    if kind == "a directory":
        raise CheckpointError(f"{quoted(path)} is a directory, not a {what}")
    raise CheckpointError(f"{quoted(path)} is {kind}, not a regular file; give the {what} itself")


def _cannot_open(path: Path, error: OSError) -> str:
    if error.errno == errno.ENOENT:
        if os.path.islink(path):
            return f"{quoted(path)} is a symlink to {quoted(os.readlink(path))}, which does not exist"
        return f"{quoted(path)} does not exist"
    if error.errno == errno.ELOOP:
        return f"{quoted(path)} is a symlink loop: following it never reaches a file"
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"cannot read {quoted(path)}: permission denied"
    return f"cannot open {quoted(path)}: {error.strerror or error}"
