"""How much of a mask is pruned, counted over all its shards: entries, or whole channels along a dim."""

from __future__ import annotations

import torch

from prunereg._distributed.collectives import gather_channels, sum_over_shards
from prunereg._distributed.layout import is_dtensor


def pruned_entries(mask: torch.Tensor) -> int:
    """The number of zeros in ``mask``, a plain tensor or a DTensor (every shard counted once)."""
    # numel - nonzeros: one pass and no bool tensor, as `mask == 0` would make at every pruning step.
    if not is_dtensor(mask):
        return mask.numel() - int(torch.count_nonzero(mask))
    local = mask.to_local()
    zeros = (local.numel() - torch.count_nonzero(local)).reshape(1)
    return int(sum_over_shards(zeros, mask).item())


def pruned_channels(mask: torch.Tensor, dim: int) -> int:
    """The number of channels along ``dim`` that ``mask`` holds only zeros of."""
    others = [d for d in range(mask.dim()) if d != dim % mask.dim()]
    if not others:  # a vector's channels are its entries (and sum(dim=[]) would sum them all)
        return pruned_entries(mask)
    if not is_dtensor(mask):
        return int(torch.count_nonzero((mask != 0).sum(dim=others) == 0))
    kept = (mask.to_local() != 0).sum(dim=others)
    return int(torch.count_nonzero(gather_channels(mask, dim % mask.dim(), kept, "sum") == 0))
