"""A new method's mask on what earlier pruning left (``PruningContainer``), for plain tensors and DTensors."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from prunereg._distributed.collectives import ChannelSpan, gather_channels
from prunereg._distributed.layout import is_dtensor, local_shard, to_shards_of, wrap
from prunereg._distributed.vectors import SpreadVector
from prunereg._selection import remaining

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

    from prunereg._selection.remaining import MaskMethod


def combine_masks(method: MaskMethod, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """:func:`prunereg._selection.remaining.combine_masks` of a plain tensor or a DTensor.

    For a DTensor, the entries (or channels) still kept are compacted on each
    rank into a DTensor of their own; ``method`` computes its mask on it, and
    the result is written back in place of those entries.
    """
    if not is_dtensor(t):
        return remaining.combine_masks(method, t, mask)
    return _sharded_combine_masks(method, t, mask)


def _sharded_combine_masks(method: MaskMethod, t: DTensor, plain_or_sharded_mask: torch.Tensor) -> torch.Tensor:
    kind = method.PRUNING_TYPE
    mask = to_shards_of(plain_or_sharded_mask, t)
    if kind == "global":
        return method.compute_mask(t, default_mask=mask).to(dtype=t.dtype)
    local_t, local_mask = t.to_local(), mask.to_local()
    new_local = local_mask.to(dtype=t.dtype, copy=True)
    if kind == "unstructured":
        kept = local_mask == 1
        spread = SpreadVector(t, [t])
        partial = method.compute_mask(spread(local_t[kept], [kept.reshape(-1)]), default_mask=spread(local_mask[kept]))
        new_local[kept] = local_shard(partial).to(dtype=t.dtype)
    elif kind == "structured":
        dim = remaining.structured_dim(method, t.dim())
        used = gather_channels(t, dim, (local_mask != 0).sum(dim=[d for d in range(t.dim()) if d != dim]), "sum")
        span = ChannelSpan.of(t, dim)
        index = used[span.offset : span.offset + span.count].nonzero().reshape(-1).to(local_t.device)
        shape = list(t.shape)
        shape[dim] = int(used.count_nonzero())
        partial = method.compute_mask(
            wrap(local_t.index_select(dim, index), t, shape),
            default_mask=wrap(local_mask.index_select(dim, index), t, shape),
        )
        new_local.index_copy_(dim, index, local_shard(partial).to(dtype=t.dtype))
    else:
        raise ValueError(f"Unrecognized PRUNING_TYPE {kind}")
    return wrap(new_local, t)
