"""Masks of whole channels (slices along one dim) of plain tensors."""

from __future__ import annotations

import torch


def channel_mask(t: torch.Tensor, keep: torch.Tensor, dim: int, default_mask: torch.Tensor) -> torch.Tensor:
    """``default_mask`` times a mask of ``t``'s shape that keeps the channels ``keep`` (indices or flags) along ``dim``.

    The result is in ``t``'s dtype: torch's ``zeros_like(t)``, ones at the kept
    channels, times ``default_mask``, computed in one pass over the tensor instead of three.
    """
    nchannels = t.shape[dim]
    if keep.dtype == torch.bool:
        channels = keep.to(device=t.device, dtype=t.dtype)
    else:  # index_fill_, not channels[keep] = 1: indexing's dispatch costs more than the fill on a small layer
        channels = torch.zeros(nchannels, dtype=t.dtype, device=t.device).index_fill_(0, keep.to(t.device), 1)
    shape = [1] * t.dim()
    shape[dim] = nchannels
    mask = torch.empty_like(t)
    if default_mask.dtype != t.dtype:
        default_mask = default_mask.to(dtype=t.dtype)
    return torch.mul(default_mask, channels.view(shape), out=mask)
