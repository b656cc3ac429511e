"""What earlier pruning left of a plain tensor, and a new method's mask computed on it.

A :class:`prunereg.PruningContainer` lets its newest method act only on what the
earlier ones left: ``"unstructured"`` methods see the entries whose mask is
still 1, ``"structured"`` ones the channels along their ``dim`` that are not all
zero, ``"global"`` ones the whole tensor. Sharded tensors take the same rules in
:func:`prunereg._distributed.combine_masks`.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import torch

# What selects the remaining entries of a tensor: a bool mask, or a slice or bool flags per dim.
Remaining = torch.Tensor | tuple[slice | torch.Tensor, ...]


class MaskMethod(Protocol):
    """What combining needs of a pruning method: its kind and its mask (``dim`` too when structured)."""

    PRUNING_TYPE: ClassVar[str]

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor: ...


def combine_masks(method: MaskMethod, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Apply ``method`` to the part of ``t`` that ``mask`` still keeps, per its ``PRUNING_TYPE``.

    Returns a new contiguous mask in ``t``'s dtype; ``mask`` is left as it was
    (torch writes into it when the dtypes agree).
    """
    new_mask = mask.to(dtype=t.dtype, memory_format=torch.contiguous_format, copy=True)
    slc = _remaining(method, t, mask)
    if isinstance(slc, torch.Tensor):
        # The entries still 1, found once: indexing with the bool mask would find them at each of its three uses.
        where = slc.reshape(-1).nonzero().squeeze(1)
        remaining = t.reshape(-1).index_select(0, where)
        partial_mask = _checked(
            method.compute_mask(remaining, default_mask=mask.reshape(-1).index_select(0, where)), remaining
        )
        new_mask.view(-1).index_copy_(0, where, partial_mask.to(dtype=new_mask.dtype))
        return new_mask
    remaining = t[slc]
    partial_mask = _checked(method.compute_mask(remaining, default_mask=mask[slc]), remaining)
    new_mask[slc] = partial_mask.to(dtype=new_mask.dtype)
    return new_mask


def _checked(partial_mask: torch.Tensor, remaining: torch.Tensor) -> torch.Tensor:
    """``partial_mask`` if it has the shape of what is left (otherwise it would broadcast over it)."""
    if partial_mask.shape != remaining.shape:
        raise RuntimeError(
            f"compute_mask returned a mask of shape {list(partial_mask.shape)} for a tensor of shape "
            f"{list(remaining.shape)}"
        )
    return partial_mask


def structured_dim(method: MaskMethod, n_dims: int) -> int:
    """The non-negative ``dim`` a structured ``method`` prunes channels along, for a tensor of ``n_dims``."""
    if not hasattr(method, "dim"):
        raise AttributeError('Pruning methods of PRUNING_TYPE "structured" need to have the attribute `dim` defined.')
    declared: int = method.dim
    dim = declared if declared >= 0 else n_dims + declared
    if not 0 <= dim < n_dims:
        raise IndexError(f"Index is out of bounds for tensor with dimensions {n_dims}")
    return dim


def _remaining(method: MaskMethod, t: torch.Tensor, mask: torch.Tensor) -> Remaining:
    kind = method.PRUNING_TYPE
    if t.is_meta and kind in ("unstructured", "structured"):
        # Meta tensors have no values, so what is left cannot be known (and
        # boolean indexing cannot run): only shapes and dtypes matter there.
        return (slice(None),) * t.dim()
    if kind == "unstructured":
        return mask == 1
    if kind == "structured":
        n_dims = t.dim()
        dim = structured_dim(method, n_dims)
        keep_channel = mask.sum(dim=[d for d in range(n_dims) if d != dim]) != 0
        slc: list[slice | torch.Tensor] = [slice(None)] * n_dims
        slc[dim] = keep_channel
        return tuple(slc)
    if kind == "global":
        return (slice(None),) * t.dim()
    raise ValueError(f"Unrecognized PRUNING_TYPE {kind}")
