"""An output folder that appears whole or not at all: built beside its target, renamed into place when complete.

Every prunereg command and function that writes a model folder writes it
through :class:`AtomicFolder`::

    with AtomicFolder(output_dir, replace=force, keep={"MODEL_DIR": model_dir}) as staging:
        model.save_pretrained(staging)  # any files and subfolders
        tokenizer.save_pretrained(staging)
    # output_dir now holds exactly what staging held

What it promises:

- The folder is built as ``.prunereg-XXXXXXXX.tmp`` in the target's parent
  (the name form of prunereg's temporary files), so the final rename stays on
  one file system and any target name the file system allows works.
- Leaving the block by an exception (``KeyboardInterrupt`` included, and the
  signals :mod:`prunereg._disk.signals` turns into one) deletes that folder:
  no partial output, nothing that blocks a re-run. A signal that comes while
  the folder is made or deleted is acted on once that is done, so the folder
  is never left half made or half deleted. SIGKILL cannot be caught and
  may leave it behind; it is safe to delete once no prunereg run is writing there.
- Without ``replace`` the folder is renamed onto the target name, which the
  system refuses once that name holds anything (a concurrent run's folder, a
  file): the run fails with "exists" and the other folder is kept. An empty
  folder at the target counts as free.
- With ``replace`` the new and the old folder are swapped in one step where
  the system can (``renameat2(RENAME_EXCHANGE)`` on Linux), then the old one is
  deleted, so a reader sees the old folder or the new one. Elsewhere the old
  folder is renamed aside first, and for a moment there is none. The folder
  keeps the replaced one's permission bits; a new one gets ``0777`` less the umask.
- Every file and folder is flushed to disk (``fsync``) before the rename.
- A write that fails for lack of space, raised in the block by Python, torch or
  safetensors, comes out as ``OSError(ENOSPC)`` saying "the disk is full".

Errors are ``OSError`` subclasses whose message is one complete sentence:
``FileExistsError``, ``NotADirectoryError``, ``FileNotFoundError`` (the parent
folder is missing), ``IsADirectoryError`` (the target is or holds a folder in
``keep``), ``OSError`` (cannot write: the system's reason).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from prunereg._disk.errors import size_text
from prunereg._disk.paths import DISK_FULL, TEMPORARY_PREFIX, TEMPORARY_SUFFIX, same, umask, within, write_failure
from prunereg._disk.rename import exchange
from prunereg._disk.signals import signals_held
from prunereg._text import quoted

_TAKEN = {errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR}
# safetensors reports the system's error inside its own message: "... (os error 28)".
_OS_ERROR_IN_MESSAGE = re.compile(r"\(os error (\d+)\)")
_PLACING_ATTEMPTS = 3  # a target that keeps appearing and vanishing under concurrent --force runs


class AtomicFolder:
    """A folder built under a temporary name beside ``target`` and renamed to ``target`` when complete.

    ``replace`` allows replacing a folder that is there (the CLI's ``--force``).
    ``label`` names the target in messages (``"OUTPUT_DIR"``, ``"output_dir"``)
    and ``replace_hint`` says how to allow replacing it. ``keep`` maps labels
    to folders that must survive the run (the input): a target that is one of
    them or holds one is refused, ``replace`` or not.

    Use it as a context manager, whose value is the (empty) folder to write
    into; :meth:`check` raises early what entering would raise, and
    :meth:`require_free_space` refuses a file system too full for the result.
    """

    def __init__(
        self,
        target: str | os.PathLike[str],
        *,
        replace: bool = False,
        label: str = "OUTPUT_DIR",
        replace_hint: str = "pass --force to replace it",
        keep: Mapping[str, str | os.PathLike[str]] | None = None,
    ) -> None:
        self.target = Path(os.path.abspath(target))
        self.replace = replace
        self.label = label
        self.replace_hint = replace_hint
        self.keep = {name: Path(path) for name, path in (keep or {}).items()}
        self._staging: Path | None = None

    # -- the API ------------------------------------------------------------------------

    def check(self) -> None:
        """Raise now what writing the folder would raise on what is there now (it is checked again at the end)."""
        target = self.target
        if target.name == "":
            raise IsADirectoryError(f"{self._named()} is the root folder; name a folder to write")
        for name, kept in self.keep.items():
            if within(kept, target):
                where = "is" if same(kept, target) else "holds"
                raise IsADirectoryError(f"{self._named()} {where} {name} {quoted(kept)}; write to another folder")
        status = _lstat(target)
        if status is not None:
            if stat.S_ISLNK(status.st_mode):
                raise NotADirectoryError(f"{self._named()} is a symlink; name the folder itself")
            if not stat.S_ISDIR(status.st_mode):
                raise NotADirectoryError(f"{self._named()} exists and is not a folder")
            if not self.replace and _has_entries(target):
                raise FileExistsError(f"{self._named()} exists and is not empty; {self.replace_hint}")
        if not target.parent.is_dir():
            raise FileNotFoundError(f"the folder holding {self._named()} does not exist")

    def require_free_space(self, needed: int) -> None:
        """Raise ``OSError(ENOSPC)`` if the target's file system has less than ``needed`` bytes free."""
        try:
            free = shutil.disk_usage(self._staging or self.target.parent).free
        except OSError:
            return  # the write itself will say what is wrong
        if free < needed:
            raise _os_error(
                errno.ENOSPC,
                f"cannot write {self._named()}: the disk is full ({size_text(free)} free, the result needs "
                f"about {size_text(needed)})",
            )

    def __enter__(self) -> Path:
        self.check()
        try:
            with signals_held():  # a signal between making the folder and holding its name would leave it behind
                self._staging = Path(
                    tempfile.mkdtemp(dir=self.target.parent, prefix=TEMPORARY_PREFIX, suffix=TEMPORARY_SUFFIX)
                )
        except OSError as error:  # a read-only or full parent folder
            raise self._cannot_write(error) from error
        except BaseException:  # the signal that came meanwhile: __exit__ will not run
            if self._staging is not None:
                _delete(self._staging)
                self._staging = None
            raise
        return self._staging

    def __exit__(
        self, error_type: type[BaseException] | None, error: BaseException | None, _: TracebackType | None
    ) -> None:
        staging, self._staging = self._staging, None
        assert staging is not None, "AtomicFolder is not re-entrant"
        if error is None:
            try:
                self._place(staging)
            except BaseException:
                _delete(staging)
                raise
            return
        _delete(staging)
        if isinstance(error, Exception) and not isinstance(error, _CannotWrite) and _system_error(error) in DISK_FULL:
            raise self._cannot_write(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))) from error

    # -- placing ------------------------------------------------------------------------

    def _place(self, staging: Path) -> None:
        try:
            _flush_tree(staging)
        except OSError as error:
            raise self._cannot_write(error) from error
        for _ in range(_PLACING_ATTEMPTS):
            status = _lstat(self.target)
            if status is None or not self.replace:
                if self._rename_onto_free_name(staging, mode=0o777 & ~umask()):
                    break
                if not self.replace:
                    raise FileExistsError(f"{self._named()} exists and is not empty; {self.replace_hint}")
            elif not stat.S_ISDIR(status.st_mode) or stat.S_ISLNK(status.st_mode):
                raise NotADirectoryError(f"{self._named()} exists and is not a folder")
            elif self._swap(staging, mode=stat.S_IMODE(status.st_mode)):
                break
        else:
            raise FileExistsError(f"{self._named()} kept changing while it was replaced; try again")
        _flush_folder(self.target.parent)

    def _rename_onto_free_name(self, staging: Path, mode: int) -> bool:
        """Rename ``staging`` to the target; ``False`` if the name holds anything by now (an empty folder aside)."""
        os.chmod(staging, mode)
        try:
            os.rename(staging, self.target)
        except OSError as error:
            if error.errno in _TAKEN:
                return False
            raise self._cannot_write(error) from error
        return True

    def _swap(self, staging: Path, mode: int) -> bool:
        """Put ``staging`` where the old folder is and delete the old one; ``False`` if the old one vanished."""
        os.chmod(staging, mode)
        try:
            swapped = exchange(staging, self.target)
        except FileNotFoundError:
            return False
        except OSError as error:
            raise self._cannot_write(error) from error
        if swapped:  # staging's name now holds the old folder
            _delete(staging)
            return True
        aside = Path(tempfile.mkdtemp(dir=self.target.parent, prefix=TEMPORARY_PREFIX, suffix=TEMPORARY_SUFFIX))
        try:
            os.rename(self.target, aside)  # replaces the empty folder just made
        except FileNotFoundError:
            _delete(aside)
            return False
        placed = self._rename_onto_free_name(staging, mode)  # False: another run placed its folder meanwhile
        _delete(aside)
        return placed

    # -- messages -----------------------------------------------------------------------

    def _named(self) -> str:
        return f"{self.label} {quoted(self.target)}"

    def _cannot_write(self, error: OSError) -> OSError:
        code = error.errno or _system_error(error)
        return _os_error(code, f"cannot write {self._named()}: {write_failure(error, code)}")


class _CannotWrite(OSError):
    """This module's own ``OSError``: its text is the whole message (no ``[Errno N]`` in front)."""


def _os_error(code: int | None, message: str) -> OSError:
    """An ``OSError`` with ``errno`` ``code`` whose text is ``message`` alone."""
    error = _CannotWrite(message)
    error.errno = code
    return error


def _system_error(error: BaseException) -> int | None:
    """The ``errno`` behind ``error`` or the errors it was raised from (safetensors names it in its message)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            return current.errno
        found = _OS_ERROR_IN_MESSAGE.search(str(current))
        if found is not None:
            return int(found.group(1))
        current = current.__cause__ or current.__context__
    return None


def _flush_tree(root: Path) -> None:
    """``fsync`` every regular file and folder under ``root``, so the rename never publishes unwritten data."""
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                descriptor = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(descriptor)
                finally:
                    os.close(descriptor)
        _flush_folder(Path(folder))


def _flush_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot fsync a folder; the data is already flushed
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _delete(folder: Path) -> None:
    """Delete ``folder`` whole: a signal that comes meanwhile is acted on once it is gone."""
    with signals_held():
        shutil.rmtree(folder, ignore_errors=True)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _has_entries(folder: Path) -> bool:
    with os.scandir(folder) as entries:
        return any(True for _ in entries)
