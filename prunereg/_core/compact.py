"""Opt-in compact masks: stored as bool, one byte per entry instead of the parameter's size.

A float32 mask costs as much memory as the weight it masks; a bool one a quarter
(half for bfloat16). The pruned tensor, gradients and state-dict keys are the
same either way, and state dicts load across both storages (and into torch's
pruning): ``load_state_dict`` copies a bool mask into a float buffer as 0/1 and
a 0/1 float mask into a bool buffer as False/True.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

_COMPACT = contextvars.ContextVar("prunereg_compact_masks", default=False)


@contextlib.contextmanager
def compact_masks(enabled: bool = True) -> Iterator[None]:
    """Store the masks of tensors pruned in this block as bool.

    >>> with prunereg.compact_masks():
    ...     prune.l1_unstructured(model.fc, "weight", amount=0.5)

    A tensor whose mask is already bool keeps a bool mask when pruned again,
    inside or outside the block. Masks with values other than 0 and 1 (from
    ``custom_from_mask``) stay in the parameter's dtype.
    """
    token = _COMPACT.set(enabled)
    try:
        yield
    finally:
        _COMPACT.reset(token)


def mask_dtype(param_dtype: torch.dtype, old_mask: torch.Tensor | None) -> torch.dtype:
    """The dtype of a new 0/1 mask for a parameter of ``param_dtype`` whose mask is ``old_mask``."""
    if old_mask is not None and old_mask.dtype == torch.bool:
        return torch.bool
    if _COMPACT.get() and (old_mask is None or is_binary(old_mask)):
        return torch.bool
    return param_dtype


def stored(mask: torch.Tensor, param_dtype: torch.dtype, old_mask: torch.Tensor | None) -> torch.Tensor:
    """``mask`` as it should be registered: bool when compact storage applies and it is 0/1."""
    if mask.dtype == torch.bool:
        return mask
    if mask_dtype(param_dtype, old_mask) == torch.bool and is_binary(mask):
        return mask != 0
    return mask


def is_binary(mask: torch.Tensor) -> bool:
    """Whether ``mask`` holds only 0 and 1 (a bool or meta mask always does)."""
    if mask.dtype == torch.bool or mask.is_meta:
        return True
    return bool(((mask == 0) | (mask == 1)).all())


def require_binary(name: str, mask: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``mask``, the mask for ``name``, holds only 0 and 1.

    Loading masks saved elsewhere refuses other values: applied, they would
    scale the weights rather than prune them.
    """
    if not is_binary(mask):
        raise ValueError(
            f"the mask for {name!r} holds values other than 0 and 1; a pruning mask keeps (1) or prunes (0)"
        )
