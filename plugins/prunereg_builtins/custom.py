"""Pruning with a mask the caller already has."""

from __future__ import annotations

import torch

from prunereg import BasePruningMethod
from prunereg._distributed import to_layout_of


class CustomFromMask(BasePruningMethod):
    """Prune where ``mask`` is zero. The mask may live on any device and have any dtype."""

    PRUNING_TYPE = "global"

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        if default_mask.shape != self.mask.shape:
            raise AssertionError(
                f"default_mask shape {default_mask.shape} must match "
                f"self.mask shape {self.mask.shape}"
            )
        return default_mask * to_layout_of(self.mask, default_mask).to(dtype=default_mask.dtype)

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str, mask: torch.Tensor) -> CustomFromMask:  # type: ignore[override]
        """Prune ``module.<name>`` where ``mask`` is zero."""
        return super().apply(module, name, mask=mask)
