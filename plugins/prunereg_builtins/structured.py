"""Structured methods: whole channels (slices along ``dim``) are pruned together."""

from __future__ import annotations

import numbers

import torch
import torch.nn.utils.prune as torch_prune

from prunereg import BasePruningMethod
from prunereg.toolkit import (
    channel_mask,
    channel_norms,
    check_amount,
    check_dim,
    check_structured,
    count_to_prune,
    top_indices,
)


class _ChannelPruning(BasePruningMethod):
    """Zero the ``amount`` channels along ``dim`` that :meth:`_channels_to_keep` leaves out."""

    PRUNING_TYPE = "structured"

    def __init__(self, amount: numbers.Real, dim: int = -1) -> None:
        check_amount(amount)
        self.amount = amount
        self.dim = dim

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        check_structured(t)
        check_dim(t, self.dim)
        nchannels = t.shape[self.dim]
        k = count_to_prune(self.amount, nchannels)
        keep = self._channels_to_keep(t, nchannels, k)
        if k == 0:
            return default_mask
        return channel_mask(t, keep, self.dim, default_mask)

    def _channels_to_keep(self, t: torch.Tensor, nchannels: int, k: int) -> torch.Tensor:
        raise NotImplementedError  # abstract


@torch_prune.RandomStructured.register  # isinstance(method, torch's RandomStructured) holds; the mask stays ours
class RandomStructured(_ChannelPruning):
    """Prune ``amount`` channels along ``dim`` chosen at random (torch's CPU draws)."""

    def _channels_to_keep(self, t: torch.Tensor, nchannels: int, k: int) -> torch.Tensor:
        if k == 0:  # torch draws nothing then: keep the generator state identical
            return torch.ones(nchannels, dtype=torch.bool)
        prob = torch.rand(nchannels)
        threshold = torch.kthvalue(prob, k=k).values
        return prob > threshold

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str, amount: numbers.Real, dim: int = -1) -> BasePruningMethod:  # type: ignore[override]
        """Prune ``amount`` random channels of ``module.<name>`` along ``dim``."""
        return super().apply(module, name, amount=amount, dim=dim)


@torch_prune.LnStructured.register  # isinstance(method, torch's LnStructured) holds; the mask stays ours
class LnStructured(_ChannelPruning):
    """Prune the ``amount`` channels along ``dim`` of lowest ``n``-norm (NaN norms first)."""

    def __init__(self, amount: numbers.Real, n: int | float | str, dim: int = -1) -> None:
        super().__init__(amount, dim)
        self.n = n

    def _channels_to_keep(self, t: torch.Tensor, nchannels: int, k: int) -> torch.Tensor:
        norm = channel_norms(t.detach(), self.n, self.dim)  # ranked only: no autograd record
        # A norm is >= 0 or NaN; the norms are this call's own, ranked in place.
        return top_indices(norm, nchannels - k, largest=True, nonnegative=True, overwrite=True)

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        amount: numbers.Real,
        n: int | float | str,
        dim: int,
        importance_scores: torch.Tensor | None = None,
    ) -> BasePruningMethod:
        """Prune the ``amount`` channels of ``module.<name>`` along ``dim`` of lowest ``n``-norm."""
        return super().apply(module, name, amount=amount, n=n, dim=dim, importance_scores=importance_scores)
