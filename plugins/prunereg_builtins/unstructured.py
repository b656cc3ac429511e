"""Unstructured methods: each entry of the tensor is pruned on its own."""

from __future__ import annotations

import numbers

import torch

from prunereg import BasePruningMethod
from prunereg._amount import nparams_to_prune, validate_amount, validate_amount_init
from prunereg._select import select_k


class Identity(BasePruningMethod):
    """Prune nothing: the mask is all ones. Useful to set up the reparametrization alone."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        return default_mask

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str) -> Identity:  # type: ignore[override]
        """Add the reparametrization to ``module.<name>`` without pruning anything."""
        return super().apply(module, name)


class _AmountUnstructured(BasePruningMethod):
    """Zero the ``amount`` entries that :meth:`_prune_first` ranks first."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: numbers.Real) -> None:
        validate_amount_init(amount)
        self.amount = amount

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        tensor_size = t.nelement()
        k = nparams_to_prune(self.amount, tensor_size)
        validate_amount(k, tensor_size)
        mask = default_mask.clone(memory_format=torch.contiguous_format)
        if k != 0:
            mask.view(-1).masked_fill_(self._prune_first(t, k).reshape(-1), 0)
        return mask

    def _prune_first(self, t: torch.Tensor, k: int) -> torch.Tensor:
        raise NotImplementedError  # abstract


class RandomUnstructured(_AmountUnstructured):
    """Prune ``amount`` entries chosen uniformly at random (torch's draws, so the same seed gives torch's mask)."""

    def _prune_first(self, t: torch.Tensor, k: int) -> torch.Tensor:
        prob = torch.rand_like(t, memory_format=torch.contiguous_format)
        return select_k([prob], k, largest=True)[0]

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str, amount: numbers.Real) -> RandomUnstructured:  # type: ignore[override]
        """Prune ``amount`` random entries of ``module.<name>``."""
        return super().apply(module, name, amount=amount)


class L1Unstructured(_AmountUnstructured):
    """Prune the ``amount`` entries of smallest absolute value (NaN first)."""

    def _prune_first(self, t: torch.Tensor, k: int) -> torch.Tensor:
        return select_k([torch.abs(t)], k)[0]

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        amount: numbers.Real,
        importance_scores: torch.Tensor | None = None,
    ) -> L1Unstructured:
        """Prune the ``amount`` entries of ``module.<name>`` (or of ``importance_scores``) of smallest magnitude."""
        return super().apply(module, name, amount=amount, importance_scores=importance_scores)
