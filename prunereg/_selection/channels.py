"""Masks of whole channels (slices along one dim) of plain tensors."""

from __future__ import annotations

import torch


def channel_mask(t: torch.Tensor, keep: torch.Tensor, dim: int, default_mask: torch.Tensor) -> torch.Tensor:
    """``default_mask`` times a mask of ``t``'s shape that keeps the channels ``keep`` (indices or flags) along ``dim``.

    The result is in ``t``'s dtype and memory format: torch's ``zeros_like(t)``, ones at
    the kept channels, times ``default_mask``, without a temporary of ``t``'s size.
    """
    if default_mask.dtype != t.dtype:
        default_mask = default_mask.to(dtype=t.dtype)
    if keep.dtype != torch.bool:
        # zeros_like(t) keeps t's dtype and memory format; index_fill_ along dim costs less
        # than torch's mask[slices] = 1 or a vector of channel flags on a small layer.
        return torch.zeros_like(t).index_fill_(dim, keep.to(t.device), 1).mul_(default_mask)
    shape = [1] * t.dim()
    shape[dim] = t.shape[dim]
    channels = keep.to(device=t.device, dtype=t.dtype).view(shape)
    return torch.mul(default_mask, channels, out=torch.empty_like(t))
