"""The N:M method: in every group of M consecutive weights along a dim, keep the N largest."""

from __future__ import annotations

import numbers

import torch

from prunereg import BasePruningMethod
from prunereg.toolkit import keep_highest_per_row, prune_where


class NMSparsity(BasePruningMethod):
    """Keep the ``n`` entries of largest magnitude in every group of ``m`` consecutive entries along ``dim``.

    ``n`` counts the weights KEPT: 2:4 (``n=2, m=4``) keeps 2 of every 4 and
    prunes half of the tensor; 4:8 keeps 4 of every 8. Groups are consecutive
    along ``dim`` (default -1, the input dimension of a ``Linear`` weight,
    which is the layout ``torch.sparse.to_sparse_semi_structured`` expects for
    2:4 on CUDA). Magnitude is ``|importance_scores|`` when those are given,
    else ``|weight|``; NaN scores are pruned first and equal scores keep the
    earlier entry.

    ``PRUNING_TYPE`` is ``"global"``: N:M groups only exist on the whole
    tensor, so combined with earlier pruning this method sees the full tensor
    and its mask, not the flattened survivors an ``"unstructured"`` method
    gets (which would shift every group). Entries pruned earlier count as the
    least important of their group, so at most ``n`` per group remain, and as
    many survivors as possible.
    """

    PRUNING_TYPE = "global"

    def __init__(self, n: int = 2, m: int = 4, dim: int = -1) -> None:
        for label, value in (("n", n), ("m", m)):
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise TypeError(f"{label} must be an int, got {value!r}")
        if not 0 < n < m:
            raise ValueError(f"N:M sparsity needs 0 < n < m (n weights kept of every m), got n={n}, m={m}")
        self.n = int(n)
        self.m = int(m)
        self.dim = dim

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0:
            raise ValueError("N:M sparsity needs a tensor with at least one dimension, got a scalar")
        if not -t.dim() <= self.dim < t.dim():
            raise IndexError(f"Invalid index {self.dim} for tensor of size {t.shape}")
        size = t.shape[self.dim]
        if size % self.m:
            raise ValueError(
                f"N:M sparsity with m={self.m} needs the size along dim {self.dim} to be a "
                f"multiple of {self.m}; tensor of shape {tuple(t.shape)} has {size}"
            )
        scores = _in_groups(t.abs(), self.dim, self.m)
        alive = _in_groups(default_mask != 0, self.dim, self.m)
        keep = keep_highest_per_row(scores, alive, self.n)
        keep = keep.reshape((*keep.shape[:-2], size)).movedim(-1, self.dim)
        return prune_where(default_mask, ~keep)

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        n: int = 2,
        m: int = 4,
        dim: int = -1,
        importance_scores: torch.Tensor | None = None,
    ) -> NMSparsity:
        """Keep the ``n`` largest of every ``m`` consecutive entries of ``module.<name>`` along ``dim``."""
        return super().apply(module, name, n=n, m=m, dim=dim, importance_scores=importance_scores)


def _in_groups(t: torch.Tensor, dim: int, m: int) -> torch.Tensor:
    """``t`` with ``dim`` moved last and split into groups of ``m``: shape (..., size // m, m)."""
    moved = t.movedim(dim, -1)
    return moved.reshape((*moved.shape[:-1], moved.shape[-1] // m, m))
