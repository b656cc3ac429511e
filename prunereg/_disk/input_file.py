"""The one way prunereg opens a file it did not write: regular files only, checked as they are opened.

A FIFO as input would block ``open()`` forever (in native code, where no
signal handler runs) and a device would never end, so anything but a regular
file is refused before a byte is read, in one line that says what the path is
(missing, a symlink loop, a directory, a FIFO...). The file is opened with
``O_NONBLOCK`` and checked again with ``fstat`` on the open descriptor, so a
path swapped for a FIFO after the first look is refused too, without waiting.
:func:`read_bounded` also refuses a file larger than its kind can be,
:func:`copy_regular` copies one, and :func:`reopenable_path` hands a library
that opens files by name (safetensors) the very file that was checked.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path
from typing import BinaryIO

from prunereg._disk.errors import CheckpointError, quoted, size_text

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}
_NONBLOCKING = getattr(os, "O_NONBLOCK", 0)  # opening a FIFO this way returns at once, so fstat can refuse it
_CHUNK = 1 << 20
_OPEN_FDS = "/proc/self/fd"  # Linux: opening /proc/self/fd/N opens the file descriptor N is open on


def open_regular(path: Path, what: str = "model file", hint: str | None = None) -> BinaryIO:
    """``path`` opened for binary reading, or :class:`CheckpointError` unless it is a regular file.

    ``what`` names the file the caller expects ("text file"); ``hint`` ends the
    refusal with what to do (default: "give the <what> itself").
    """
    refuse_unless_regular(path, _status(path), what, hint)
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCKING | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    except OSError as error:
        raise CheckpointError(_cannot_open(path, error)) from error
    try:  # the path may have been swapped for something else since the first look
        refuse_unless_regular(path, os.fstat(fd), what, hint)
        if _NONBLOCKING:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_bounded(path: Path, limit: int, what: str, hint: str) -> bytes:
    """The bytes of regular file ``path``, or :class:`CheckpointError` if it holds more than ``limit`` of them."""
    with open_regular(path, what, hint) as handle:
        size = os.fstat(handle.fileno()).st_size
        chunks: list[bytes] = []
        read = 0
        while size <= limit and read <= limit:  # in chunks: read(n) would set n bytes aside at once
            chunk = handle.read(min(_CHUNK, limit + 1 - read))
            if not chunk:
                break
            chunks.append(chunk)
            read += len(chunk)
    if max(size, read) > limit:  # a file growing meanwhile is caught too
        raise CheckpointError(
            f"{quoted(path)} holds {size_text(max(size, read))}, more than a {what} can ({size_text(limit)}); {hint}"
        )
    return b"".join(chunks)


def copy_regular(path: Path, target: Path, what: str, hint: str) -> None:
    """Copy regular file ``path``, opened by :func:`open_regular`, to the new file ``target`` (mode, times too)."""
    with open_regular(path, what, hint) as source, open(target, "xb") as copy:
        shutil.copyfileobj(source, copy)
    shutil.copystat(path, target)


def reopenable_path(handle: BinaryIO, path: Path) -> str:
    """A name that opens the same file as the open ``handle``: ``/proc/self/fd/N`` where the system has it.

    Elsewhere it is ``path`` itself, which :func:`open_regular` checked a moment ago.
    """
    by_descriptor = f"{_OPEN_FDS}/{handle.fileno()}"
    return by_descriptor if os.path.isdir(_OPEN_FDS) else str(path)


def refuse_unless_regular(
    path: Path, status: os.stat_result, what: str = "model file", hint: str | None = None
) -> None:
    """Raise :class:`CheckpointError` unless ``status`` (of ``path``) is a regular file's, naming what it is."""
    if stat.S_ISREG(status.st_mode):
        return
    kind = _KINDS.get(stat.S_IFMT(status.st_mode), "not a regular file")
    if kind == "a directory":
        raise CheckpointError(f"{quoted(path)} is a directory, not a {what}" + (f"; {hint}" if hint else ""))
    raise CheckpointError(f"{quoted(path)} is {kind}, not a regular file; {hint or f'give the {what} itself'}")


def _status(path: Path) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as error:
        raise CheckpointError(_cannot_open(path, error)) from error


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
