"""How many threads the radix select's operations run on: as many as their size pays for.

A CPU operation split over threads (OpenMP's static schedule) ends when its
slowest part ends. When another process keeps a core busy, the thread sharing
that core waits for its time slice (milliseconds) in every operation, and the
radix select runs tens of operations over blocks of at most
:data:`~prunereg._selection.select.BLOCK` entries (milliseconds each). Measured
for ``l1_unstructured`` on 4096 x 4096 float32 on 2 cores, median: 66-100 ms on
2 threads alone but 370-710 ms beside one busy process, 101 ms on one thread
either way (a 2-core machine); on 2 pinned cores of another, 96-106 ms alone and
753 ms busy on 2 threads, against 170-200 ms alone and 209 ms busy with the
selection on one thread (8192 x 8192: 405-480 ms and 3.0 s, against 674-968 ms
and 717 ms). So an operation gets a second thread only for every
:data:`ENTRIES_PER_THREAD` entries it handles, far more than a block holds: the
selection runs on one thread, slower on an idle machine, several times faster on
a shared one, and about as fast on both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# Entries an operation must handle per thread before that thread pays for the
# time slice it may wait for (several ms on a busy machine, against ~0.5 ms of
# work per million entries).
ENTRIES_PER_THREAD = 1 << 26


def threads_for(entries_per_operation: int) -> int:
    """Threads for CPU operations of ``entries_per_operation`` entries: one per ``ENTRIES_PER_THREAD``, at least
    one, at most the caller's ``torch.get_num_threads()``."""
    return max(1, min(torch.get_num_threads(), entries_per_operation // ENTRIES_PER_THREAD))


@contextlib.contextmanager
def bounded_threads(entries_per_operation: int, device: torch.device) -> Iterator[int]:
    """Run the block on :func:`threads_for` threads (CPU only); the caller's setting is restored exactly after.

    Yields the thread count in force. Nothing changes when the caller already
    uses no more threads, or for other devices. ``torch.set_num_threads``
    affects the calling thread's OpenMP team (and MKL's setting), so the bound
    holds for this selection and its restore for the caller.
    """
    previous = torch.get_num_threads()
    wanted = threads_for(entries_per_operation) if device.type == "cpu" else previous
    if wanted >= previous:
        yield previous
        return
    torch.set_num_threads(wanted)
    try:
        yield wanted
    finally:
        torch.set_num_threads(previous)
