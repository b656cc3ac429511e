"""Resident memory of this process, read from /proc (Linux), and a guard against using too much."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import resource
from pathlib import Path

GIB = 1 << 30


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def trim() -> None:
    """Return freed heap memory to the kernel (glibc), so that :func:`rss` counts live memory only."""
    name = ctypes.util.find_library("c")
    if name:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(name).malloc_trim(0)


def rss() -> int:
    """Bytes resident now."""
    kib = _status_kib("VmRSS")
    return kib * 1024 if kib is not None else 0


def reset_peak() -> bool:
    """Make the peak resident size (VmHWM) restart from now; False where the kernel cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak() -> int:
    """Bytes resident at the peak since the last :func:`reset_peak` (or since the start)."""
    kib = _status_kib("VmHWM")
    if kib is None:  # not Linux: ru_maxrss, never reset
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return kib * 1024


def available() -> int:
    """Bytes the machine can still give (MemAvailable), 0 if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def cap_address_space(limit: int) -> None:
    """Fail allocations (MemoryError) past ``limit`` bytes instead of letting the OOM killer pick a victim."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
