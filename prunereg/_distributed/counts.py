"""How much of a mask is pruned, counted over all its shards: entries, or whole channels along a dim."""

from __future__ import annotations

import torch

from prunereg._distributed.collectives import gather_channels, sum_over_shards
from prunereg._distributed.layout import is_dtensor

CHUNK = 1 << 20  # entries counted at a time: the bool tensor of one chunk is all a count allocates


def pruned_entries(mask: torch.Tensor) -> int:
    """The number of zeros in ``mask``, a plain tensor or a DTensor (every shard counted once)."""
    if not is_dtensor(mask):
        return mask.numel() - _nonzeros(mask)
    local = mask.to_local()
    zeros = (local.numel() - torch.count_nonzero(local)).reshape(1)
    return int(sum_over_shards(zeros, mask).item())


def _nonzeros(tensor: torch.Tensor) -> int:
    """``count_nonzero``; on a CPU chunk by chunk through ``bool().sum()``, several times faster.

    torch's CPU count_nonzero measured 0.3 ms for 256 x 256 floats where
    ``bool().sum()`` took 0.03 ms (torch 2.13); a gradual pruning step counts
    every mask twice. NaN is not zero, as in count_nonzero. Elsewhere one
    count_nonzero, one synchronization.
    """
    if tensor.device.type != "cpu":
        return int(torch.count_nonzero(tensor))
    flat = tensor.reshape(-1)
    return sum(int(flat[start : start + CHUNK].bool().sum()) for start in range(0, flat.numel(), CHUNK))


def pruned_channels(mask: torch.Tensor, dim: int) -> int:
    """The number of channels along ``dim`` that ``mask`` holds only zeros of."""
    others = [d for d in range(mask.dim()) if d != dim % mask.dim()]
    if not others:  # a vector's channels are its entries (and sum(dim=[]) would sum them all)
        return pruned_entries(mask)
    if not is_dtensor(mask):
        return int(torch.count_nonzero((mask != 0).sum(dim=others) == 0))
    kept = (mask.to_local() != 0).sum(dim=others)
    return int(torch.count_nonzero(gather_channels(mask, dim % mask.dim(), kept, "sum") == 0))
