"""Random draws for plain tensors and DTensors, the same whatever the number of ranks.

Every rank draws the whole tensor's stream from its default generator (the same
seed gives the same stream), keeping only its own part; so masks agree across
ranks and do not depend on their number.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from prunereg._distributed.layout import is_dtensor, wrap
from prunereg._distributed.vectors import draw_sources

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

# Random draws are generated in blocks of at most this many entries (64 MiB of
# fp32): enough that a 4096 x 4096 layer is one block, so on CUDA its draws are
# those of torch.rand_like on the full tensor; on CPU the generator is a stream
# and block boundaries never change the draws.
DRAW_BLOCK = 1 << 24


def rand_like(t: torch.Tensor) -> torch.Tensor:
    """``torch.rand_like(t)``, contiguous; for a DTensor each rank keeps its part of the full tensor's draws.

    Every rank draws the whole tensor's stream from its default generator (the
    same seed gives the same stream), in blocks whose boundaries depend on the
    shape only; so the draws do not depend on the number of ranks, and on CPU
    they are exactly ``torch.rand_like`` of the full tensor.
    """
    if not is_dtensor(t):
        return torch.rand_like(t, memory_format=torch.contiguous_format)
    return _sharded_rand_like(t)


def _sharded_rand_like(t: DTensor) -> DTensor:
    sources = draw_sources(t)
    if sources is None:
        local = _box_draws(t, t.dtype)
    elif all(keep is None for _, keep in sources) and sum(s.numel() for s, _ in sources) <= DRAW_BLOCK:
        # torch draws a global vector in one call; on CUDA, draws made one source
        # at a time would come from other counter offsets and differ.
        local = torch.cat([part.reshape(-1) for part in _one_draw_boxes([s for s, _ in sources], t.dtype)])
    else:
        # A vector of what earlier pruning left: the draws of each source at its
        # kept entries (flat flags over its local shard; None: all of them).
        draws = [_box_draws(source, t.dtype).reshape(-1) for source, _ in sources]
        local = torch.cat([d if keep is None else d[keep] for d, (_, keep) in zip(draws, sources)])
    return wrap(local, t)


def _one_draw_boxes(sources: list[DTensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """Each source's local box of one ``torch.rand`` over all the sources' entries, in order."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    stream = torch.rand(sum(s.numel() for s in sources), dtype=dtype, device=sources[0].device)
    boxes, start = [], 0
    for source in sources:
        _reject_strided(source)
        local_shape, offset = compute_local_shape_and_global_offset(source.shape, source.device_mesh, source.placements)
        full = stream[start : start + source.numel()].view(source.shape)
        boxes.append(full[tuple(slice(lo, lo + size) for lo, size in zip(offset, local_shape))])
        start += source.numel()
    return boxes


def _box_draws(t: DTensor, dtype: torch.dtype) -> torch.Tensor:
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _reject_strided(t)
    local_shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    out = torch.empty(local_shape, dtype=dtype, device=t.device)
    box = [(start, start + size) for start, size in zip(offset, local_shape)]
    _draw_block(out, tuple(t.shape), box, dtype, t.device)
    return out


def _draw_block(
    out: torch.Tensor | None,
    shape: tuple[int, ...],
    box: list[tuple[int, int]],
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Draw a block of ``shape`` from the stream and copy its ``box`` into ``out`` (None: discard).

    The calls to the generator depend on ``shape`` alone, never on ``box``.
    """
    numel = math.prod(shape)
    if numel == 0:
        return
    inner = math.prod(shape[1:])
    if numel <= DRAW_BLOCK:
        block = torch.rand(shape, dtype=dtype, device=device)
        if out is not None:
            out.copy_(block[tuple(slice(lo, hi) for lo, hi in box)])
        return
    (first_lo, first_hi), inner_box = box[0], box[1:]
    if inner <= DRAW_BLOCK:
        rows = DRAW_BLOCK // inner
        inner_slices = tuple(slice(lo, hi) for lo, hi in inner_box)
        for start in range(0, shape[0], rows):
            stop = min(start + rows, shape[0])
            block = torch.rand((stop - start, *shape[1:]), dtype=dtype, device=device)
            lo, hi = max(start, first_lo), min(stop, first_hi)
            if out is not None and lo < hi:
                out[lo - first_lo : hi - first_lo].copy_(block[tuple([slice(lo - start, hi - start), *inner_slices])])
        return
    for row in range(shape[0]):
        part = out[row - first_lo] if out is not None and first_lo <= row < first_hi else None
        _draw_block(part, shape[1:], inner_box, dtype, device)


def _reject_strided(t: DTensor) -> None:
    for placement in t.placements:
        if placement.is_shard() and type(placement).__name__ != "Shard":
            raise NotImplementedError(
                f"prunereg cannot prune a DTensor with placement {placement} (only Shard and Replicate)"
            )
