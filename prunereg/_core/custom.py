"""The core's "apply this mask" method, registered by the built-in plugin as ``custom_from_mask``.

Global pruning and :func:`prunereg.apply_masks` install masks computed elsewhere
with it, so it belongs to the core; the built-in plugin re-exports it.
"""

from __future__ import annotations

import torch
import torch.nn.utils.prune as torch_prune

from prunereg._core.method import BasePruningMethod
from prunereg._distributed.layout import to_layout_of


@torch_prune.CustomFromMask.register  # isinstance(method, torch's CustomFromMask) holds; the mask stays ours
class CustomFromMask(BasePruningMethod):
    """Prune where ``mask`` is zero. The mask may live on any device and have any dtype."""

    PRUNING_TYPE = "global"
    chosen_by: type[BasePruningMethod] | None = None
    """The method whose choice the mask is, when one chose it for this tensor (global pruning); summaries name it."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        if default_mask.shape != self.mask.shape:
            raise AssertionError(
                f"default_mask shape {default_mask.shape} must match self.mask shape {self.mask.shape}"
            )
        return default_mask * to_layout_of(self.mask, default_mask).to(dtype=default_mask.dtype)

    @classmethod
    def apply(  # type: ignore[override]  # torch's signature: the mask is the one argument
        cls, module: torch.nn.Module, name: str, mask: torch.Tensor
    ) -> BasePruningMethod:
        """Prune ``module.<name>`` where ``mask`` is zero."""
        return super().apply(module, name, mask=mask)
