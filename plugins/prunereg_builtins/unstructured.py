"""Unstructured methods: each entry of the tensor is pruned on its own."""

from __future__ import annotations

import numbers

import torch
import torch.nn.utils.prune as torch_prune

from prunereg import BasePruningMethod
from prunereg.toolkit import check_amount, count_to_prune, prune_lowest, rand_like


@torch_prune.Identity.register  # isinstance(method, torch's Identity) holds; the mask stays ours
class Identity(BasePruningMethod):
    """Prune nothing: the mask is all ones. Useful to set up the reparametrization alone."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        return default_mask

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str) -> BasePruningMethod:  # type: ignore[override]
        """Add the reparametrization to ``module.<name>`` without pruning anything."""
        return super().apply(module, name)


class _AmountUnstructured(BasePruningMethod):
    """Zero the ``amount`` entries that :meth:`_pruned` ranks first."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: numbers.Real) -> None:
        check_amount(amount)
        self.amount = amount

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        k = count_to_prune(self.amount, t.nelement())
        if k == 0:
            return default_mask.clone(memory_format=torch.contiguous_format)
        return self._pruned(t, k, default_mask)

    def _pruned(self, t: torch.Tensor, k: int, default_mask: torch.Tensor) -> torch.Tensor:
        """``default_mask`` with ``k`` more zeros, at the entries this method ranks first."""
        raise NotImplementedError  # abstract


@torch_prune.RandomUnstructured.register  # isinstance(method, torch's RandomUnstructured) holds; the mask stays ours
class RandomUnstructured(_AmountUnstructured):
    """Prune ``amount`` entries chosen uniformly at random (torch's draws, so the same seed gives torch's mask)."""

    RANKED_BY = "random"

    def _pruned(self, t: torch.Tensor, k: int, default_mask: torch.Tensor) -> torch.Tensor:
        prob = rand_like(t)
        return prune_lowest(prob, k, default_mask, largest=True, out=prob)  # the draws' memory becomes the mask

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str, amount: numbers.Real) -> BasePruningMethod:  # type: ignore[override]
        """Prune ``amount`` random entries of ``module.<name>``."""
        return super().apply(module, name, amount=amount)


@torch_prune.L1Unstructured.register  # isinstance(method, torch's L1Unstructured) holds; the mask stays ours
class L1Unstructured(_AmountUnstructured):
    """Prune the ``amount`` entries of smallest absolute value (NaN first)."""

    RANKED_BY = "magnitude"

    def _pruned(self, t: torch.Tensor, k: int, default_mask: torch.Tensor) -> torch.Tensor:
        return prune_lowest(t, k, default_mask, magnitude=True)

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        amount: numbers.Real,
        importance_scores: torch.Tensor | None = None,
    ) -> BasePruningMethod:
        """Prune the ``amount`` entries of ``module.<name>`` (or of ``importance_scores``) of smallest magnitude."""
        return super().apply(module, name, amount=amount, importance_scores=importance_scores)
