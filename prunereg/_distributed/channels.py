"""Channel norms and channel masks (structured pruning) of plain tensors and DTensors."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from prunereg._distributed.collectives import ChannelSpan, gather_channels
from prunereg._distributed.layout import is_dtensor, local_shard, wrap
from prunereg._selection import amount, channels

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


def channel_norms(t: torch.Tensor, n: int | float | str, dim: int) -> torch.Tensor:
    """The ``n``-norm of every slice of ``t`` along ``dim``; for a DTensor, the same full vector on every rank.

    Each rank reduces its shard to partial statistics per channel (sum of
    ``|x|^p``, count of non-zeros, max or min of ``|x|``); these are combined
    across the ranks that split a channel, and gathered along ``dim``.
    """
    if not is_dtensor(t):
        return amount.compute_norm(t, n, dim)
    return _sharded_channel_norms(t, n, dim)


def _sharded_channel_norms(t: DTensor, n: int | float | str, dim: int) -> torch.Tensor:
    # torch's own checks of n and dim, on a tensor without data.
    amount.compute_norm(torch.empty(t.shape, dtype=t.dtype, device="meta"), n, dim)
    dim = dim % t.dim()
    if n == "fro":
        n = 2
    if not isinstance(n, (int, float)):
        raise NotImplementedError(f"ln_structured on a DTensor supports numeric n and 'fro', not {n!r}")
    local = t.to_local()
    others = [d for d in range(t.dim()) if d != dim]
    if n == math.inf:
        stats, op = _amax(local.abs(), others), "max"
    elif n == -math.inf:
        stats, op = -_amax(-local.abs(), others), "min"
    elif n == 0:
        stats, op = (local != 0).sum(dim=others, dtype=torch.float64), "sum"
    else:
        stats, op = local.abs().to(torch.float64).pow(n).sum(dim=others), "sum"
    norms = gather_channels(t, dim, stats, op)
    if n not in (0, math.inf, -math.inf):
        norms = norms.pow(1.0 / n)
    return norms


def _amax(values: torch.Tensor, dims: list[int]) -> torch.Tensor:
    if values.numel() == 0:  # an empty shard holds no channel or adds nothing to one
        shape = [s for d, s in enumerate(values.shape) if d not in dims]
        return torch.full(shape, -math.inf, dtype=torch.float64, device=values.device)
    return values.amax(dim=dims).to(torch.float64)


def channel_mask(t: torch.Tensor, keep: torch.Tensor, dim: int, default_mask: torch.Tensor) -> torch.Tensor:
    """``default_mask`` times the mask of ``t`` keeping the channels ``keep`` along ``dim``, in ``t``'s dtype.

    ``keep`` holds indices or flags, the same on every rank.
    """
    if not is_dtensor(t):
        return channels.channel_mask(t, keep, dim, default_mask)
    return _sharded_channel_mask(t, keep, dim, default_mask)


def _sharded_channel_mask(t: DTensor, keep: torch.Tensor, dim: int, default_mask: torch.Tensor) -> DTensor:
    flags = torch.zeros(t.shape[dim], dtype=torch.bool, device=keep.device)
    flags[keep] = True
    span = ChannelSpan.of(t, dim)
    local_keep = flags[span.offset : span.offset + span.count]
    shape = [1] * t.dim()
    shape[dim] = span.count
    local = torch.zeros_like(t.to_local())
    local += local_keep.reshape(shape).to(device=local.device, dtype=local.dtype)
    local *= local_shard(default_mask).to(dtype=local.dtype)
    return wrap(local, t)
