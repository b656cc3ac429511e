"""Swapping two paths in one step, where the system can (Linux's ``renameat2(RENAME_EXCHANGE)``)."""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import sys
from pathlib import Path
from typing import Any

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# The kernel or the file system cannot swap (old kernels, some network and FUSE mounts).
_CANNOT_EXCHANGE = {errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP}


@functools.cache
def _renameat2() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2  # glibc 2.28 and later
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def exchange(first: Path, second: Path) -> bool:
    """Swap the entries at ``first`` and ``second`` atomically; ``False`` where the system cannot swap.

    Both must exist (``FileNotFoundError`` otherwise); any other refusal is the
    ``OSError`` the system gave.
    """
    function = _renameat2()
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _CANNOT_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), os.fspath(second))
