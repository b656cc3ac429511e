"""Masks of whole channels (slices along one dim) of plain tensors."""

from __future__ import annotations

import weakref
from collections.abc import Callable

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
        mask = torch.zeros_like(t).index_fill_(dim, keep.to(t.device), 1)
        return mask if still_ones(default_mask) else mask.mul_(default_mask)
    shape = [1] * t.dim()
    shape[dim] = t.shape[dim]
    channels = keep.to(device=t.device, dtype=t.dtype).view(shape)
    return torch.mul(default_mask, channels, out=torch.empty_like(t))


def ones_like(t: torch.Tensor) -> torch.Tensor:
    """``torch.ones_like(t)``, known to be all ones until written to (:func:`still_ones`).

    The default mask of a tensor's first pruning: a mask multiplied by it is
    unchanged, and :func:`channel_mask` skips that pass over the layer (a few
    percent of a small layer's call). Only the newest such tensor is known, by
    a weak reference and its version counter, which every in-place write bumps.
    """
    global _ones
    ones = torch.ones_like(t)
    _ones = (weakref.ref(ones), ones._version)
    return ones


def still_ones(mask: torch.Tensor) -> bool:
    """Whether ``mask`` is the newest :func:`ones_like` tensor, not written to since: all ones, without a look."""
    known, version = _ones
    return known() is mask and mask._version == version


_ones: tuple[Callable[[], torch.Tensor | None], int] = (lambda: None, -1)  # none known yet
