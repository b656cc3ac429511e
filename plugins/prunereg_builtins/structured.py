"""Structured methods: whole channels (slices along ``dim``) are pruned together."""

from __future__ import annotations

import numbers

import torch

from prunereg import BasePruningMethod
from prunereg._amount import compute_norm, validate_dim, validate_structured
from prunereg._distributed import channel_mask, is_dtensor
from prunereg._select import top_indices
from prunereg.toolkit import check_amount, count_to_prune


class _ChannelPruning(BasePruningMethod):
    """Zero the ``amount`` channels along ``dim`` that :meth:`_channels_to_keep` leaves out."""

    PRUNING_TYPE = "structured"

    def __init__(self, amount: numbers.Real, dim: int = -1) -> None:
        check_amount(amount)
        self.amount = amount
        self.dim = dim

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        validate_structured(t)
        validate_dim(t, self.dim)
        nchannels = t.shape[self.dim]
        k = count_to_prune(self.amount, nchannels)
        keep = self._channels_to_keep(t, nchannels, k)
        if k == 0:
            return default_mask
        if is_dtensor(t):
            return channel_mask(t, keep, self.dim, default_mask)
        # torch's zeros_like(t), ones at the kept channels, times default_mask:
        # the same products, in one pass over the tensor instead of three.
        channels = torch.zeros(nchannels, dtype=t.dtype, device=t.device)
        channels[keep] = 1
        shape = [1] * t.dim()
        shape[self.dim] = nchannels
        mask = torch.empty_like(t)
        return torch.mul(default_mask.to(dtype=t.dtype), channels.view(shape), out=mask)

    def _channels_to_keep(self, t: torch.Tensor, nchannels: int, k: int) -> torch.Tensor:
        raise NotImplementedError  # abstract


class RandomStructured(_ChannelPruning):
    """Prune ``amount`` channels along ``dim`` chosen at random (torch's CPU draws)."""

    def _channels_to_keep(self, t: torch.Tensor, nchannels: int, k: int) -> torch.Tensor:
        if k == 0:  # torch draws nothing then: keep the generator state identical
            return torch.ones(nchannels, dtype=torch.bool)
        prob = torch.rand(nchannels)
        threshold = torch.kthvalue(prob, k=k).values
        return prob > threshold

    @classmethod
    def apply(cls, module: torch.nn.Module, name: str, amount: numbers.Real, dim: int = -1) -> RandomStructured:  # type: ignore[override]
        """Prune ``amount`` random channels of ``module.<name>`` along ``dim``."""
        return super().apply(module, name, amount=amount, dim=dim)


class LnStructured(_ChannelPruning):
    """Prune the ``amount`` channels along ``dim`` of lowest ``n``-norm (NaN norms first)."""

    def __init__(self, amount: numbers.Real, n: int | float | str, dim: int = -1) -> None:
        super().__init__(amount, dim)
        self.n = n

    def _channels_to_keep(self, t: torch.Tensor, nchannels: int, k: int) -> torch.Tensor:
        norm = compute_norm(t, self.n, self.dim)
        return top_indices(norm, nchannels - k, largest=True)

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        amount: numbers.Real,
        n: int | float | str,
        dim: int,
        importance_scores: torch.Tensor | None = None,
    ) -> LnStructured:
        """Prune the ``amount`` channels of ``module.<name>`` along ``dim`` of lowest ``n``-norm."""
        return super().apply(module, name, amount=amount, n=n, dim=dim, importance_scores=importance_scores)
