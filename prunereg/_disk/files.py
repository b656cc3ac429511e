"""Output files put in place whole, or not at all, and never over a file that appeared meanwhile.

Each file is written to a temporary file in its target's directory, named
``.prunereg-XXXXXXXX.tmp`` (short, so that any target name the file system
allows works), and put in place once every file is written:

- without ``replace``, by a hard link to the target name, which fails if the
  name exists by then: a file that appeared during the run (another run's
  output, say) is kept, and this run fails with the usual "exists" error;
- with ``replace``, by ``os.replace``, keeping the replaced file's permissions.

A reader sees no file or the complete new one. On any error, and on
``KeyboardInterrupt`` or :mod:`prunereg._disk.signals`'s signals, every
temporary file is removed, and every target this run created is taken back.
A signal that comes while a temporary file is made, the files are put in
place or the temporary files are removed is acted on once that is done.
:func:`prunereg.prune_file` and the ``prunereg`` commands write through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prunereg._disk.errors import CheckpointError
from prunereg._disk.paths import TEMPORARY_PREFIX, TEMPORARY_SUFFIX, identity, umask, write_failure
from prunereg._disk.signals import signals_held
from prunereg._text import quoted

# Hard links refused by the file system itself (FAT, some network and FUSE mounts), not by a name clash.
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS, errno.EXDEV}


@dataclass
class _Staged:
    label: str
    target: Path
    temporary: str
    created: tuple[int, int] | None = None
    """``(device, inode)`` of the file this run created at ``target`` without ``replace``."""


class AtomicOutputs:
    """Files written beside their targets under temporary names, put in place together.

    Used as a context manager: :meth:`stage` writes each file; leaving the
    block normally puts them all in place, leaving it by an exception removes
    them. ``replace`` allows replacing existing targets (the CLI's ``--force``);
    ``force_hint`` ends the message about a target that exists without it.
    """

    def __init__(self, *, replace: bool, force_hint: str = "pass --force to replace it") -> None:
        self._replace = replace
        self._force_hint = force_hint
        self._staged: list[_Staged] = []

    def stage(self, label: str, target: Path, write: Callable[[str], object]) -> None:
        """Run ``write(temporary_path)`` for the file that will become ``target`` (called ``label`` in errors)."""
        try:
            with signals_held():  # a signal between making the file and holding its name would leave it behind
                fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=TEMPORARY_PREFIX, suffix=TEMPORARY_SUFFIX)
                self._staged.append(_Staged(label, target, temporary))
        except OSError as error:  # a read-only or full directory
            raise CheckpointError(f"cannot write {label} {quoted(target)}: {write_failure(error)}") from error
        os.close(fd)
        try:
            write(temporary)
            with open(temporary, "rb") as handle:
                os.fsync(handle.fileno())
        except OSError as error:
            raise CheckpointError(f"cannot write {label} {quoted(target)}: {write_failure(error)}") from error

    def __enter__(self) -> AtomicOutputs:
        return self

    def __exit__(self, error_type: type[BaseException] | None, *_: object) -> None:
        with signals_held():  # placing and removing must not stop halfway: a signal is acted on once they are done
            try:
                if error_type is None:
                    self._place_all()
            except BaseException:
                self._take_back()
                raise
            finally:
                for staged in self._staged:
                    _remove(staged.temporary)

    def _place_all(self) -> None:
        default_mode = 0o666 & ~umask()
        for staged in self._staged:
            if self._replace:
                os.chmod(staged.temporary, _mode_of(staged.target, default_mode))
                os.replace(staged.temporary, staged.target)
            else:
                os.chmod(staged.temporary, default_mode)
                staged.created = _place_new(staged, self._force_hint)

    def _take_back(self) -> None:
        """Remove the targets this run created without ``replace`` (a replaced file cannot come back)."""
        for staged in self._staged:
            if staged.created is not None and identity(staged.target) == staged.created:
                _remove(str(staged.target))


def _place_new(staged: _Staged, force_hint: str) -> tuple[int, int] | None:
    """Give the temporary file the target's name, failing if that name exists by now; the new file's identity."""
    try:
        os.link(staged.temporary, staged.target)
        return identity(staged.temporary)
    except FileExistsError:
        raise _exists(staged, force_hint) from None
    except OSError as error:
        if error.errno not in _NO_HARD_LINKS:
            raise
    return _copy_exclusively(staged, force_hint)


def _copy_exclusively(staged: _Staged, force_hint: str) -> tuple[int, int]:
    """Without hard links: create the target exclusively and copy into it (readers may see it grow)."""
    try:
        fd = os.open(staged.target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    except FileExistsError:
        raise _exists(staged, force_hint) from None
    try:
        with os.fdopen(fd, "wb") as destination, open(staged.temporary, "rb") as source:
            created = os.fstat(destination.fileno())
            shutil.copyfileobj(source, destination)
            destination.flush()
            os.fsync(destination.fileno())
    except BaseException as error:
        _remove(str(staged.target))
        if isinstance(error, OSError):
            raise CheckpointError(
                f"cannot write {staged.label} {quoted(staged.target)}: {write_failure(error)}"
            ) from error
        raise
    return created.st_dev, created.st_ino


def _exists(staged: _Staged, force_hint: str) -> CheckpointError:
    return CheckpointError(f"{staged.label} {quoted(staged.target)} exists; {force_hint}")


def _mode_of(target: Path, default: int) -> int:
    """The permission bits of the regular file at ``target``, else ``default``."""
    try:
        status = os.stat(target)
    except OSError:
        return default
    return stat.S_IMODE(status.st_mode) & 0o777 if stat.S_ISREG(status.st_mode) else default


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
