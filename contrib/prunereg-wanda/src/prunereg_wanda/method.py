"""The Wanda method: per output row, prune the lowest ``|W| x ||X_j||`` scores."""

from __future__ import annotations

import numbers

import torch

from prunereg import BasePruningMethod
from prunereg.toolkit import check_amount, count_to_prune, keep_highest_per_row, prune_where


def wanda_scores(weight: torch.Tensor, activation_norms: torch.Tensor) -> torch.Tensor:
    """Wanda's importance of every weight: ``|W[i, j]| * activation_norms[j]``.

    ``weight`` is ``(out_features, in_features)``; ``activation_norms`` holds the
    L2 norm of each input feature over the calibration tokens (see
    :class:`prunereg_wanda.InputNorms`). Useful on its own as
    ``importance_scores`` for other methods, N:M sparsity for one.
    """
    return weight.detach().abs() * activation_norms.to(device=weight.device)


class WandaPruning(BasePruningMethod):
    """Prune ``amount`` of every output row of a 2-D weight, lowest ``|W| x input-activation norm`` first.

    Wanda (Sun et al. 2023, "A Simple and Effective Pruning Approach for Large
    Language Models") scores weight ``W[i, j]`` by ``|W[i, j]|`` times the L2
    norm of input feature ``j`` over calibration data, and compares scores
    within each output row ``i`` only, so every row loses the same fraction.
    ``activation_norms`` is that ``(in_features,)`` vector, e.g. from
    :class:`prunereg_wanda.InputNorms`. ``importance_scores`` given to
    ``apply`` stand in for ``W``.

    ``amount``: a float is the fraction of each row's remaining entries to prune
    (rounded half to even, like torch); an int the number per row. NaN scores
    are pruned first; equal scores prune the later column.

    ``PRUNING_TYPE`` is ``"global"``: rows only exist on the whole tensor, so in
    a container this method sees the full weight and the earlier mask (an
    ``"unstructured"`` method would get the survivors flattened into one row).
    Like every later method it acts only on what is left: 0.5 after 0.5 leaves
    a quarter of each row.
    """

    PRUNING_TYPE = "global"

    def __init__(self, amount: numbers.Real, activation_norms: torch.Tensor) -> None:
        check_amount(amount)
        if not isinstance(activation_norms, torch.Tensor):
            raise TypeError(f"activation_norms must be a tensor, got {type(activation_norms).__name__}")
        if activation_norms.dim() != 1:
            raise ValueError(
                "activation_norms must be one norm per input feature, a 1-D tensor; "
                f"got shape {tuple(activation_norms.shape)}"
            )
        if not activation_norms.is_meta and bool((activation_norms < 0).any()):
            raise ValueError("activation_norms are L2 norms and cannot be negative")
        self.amount = amount
        self.activation_norms = activation_norms.detach()

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        if t.dim() != 2:
            raise ValueError(f"Wanda prunes 2-D (out_features, in_features) weights; got shape {tuple(t.shape)}")
        in_features = t.shape[1]
        if self.activation_norms.numel() != in_features:
            raise ValueError(
                f"activation_norms has {self.activation_norms.numel()} entries but the weight has "
                f"{in_features} input features"
            )
        alive = default_mask != 0
        remaining = alive.sum(dim=1)
        if isinstance(self.amount, numbers.Integral):
            fewest_left = in_features if t.is_meta or not remaining.numel() else int(remaining.min())
            count_to_prune(self.amount, fewest_left)  # an int larger than a row has left is a ValueError
            to_prune = torch.full_like(remaining, int(self.amount))
        else:
            # float64 and half-to-even rounding: Python's round(amount * n) for every row at once.
            to_prune = torch.round(remaining.to(torch.float64) * float(self.amount)).to(remaining.dtype)
        keep = keep_highest_per_row(wanda_scores(t, self.activation_norms), alive, remaining - to_prune)
        return prune_where(default_mask, ~keep)

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: torch.nn.Module,
        name: str,
        amount: numbers.Real,
        activation_norms: torch.Tensor,
        importance_scores: torch.Tensor | None = None,
    ) -> WandaPruning:
        """Prune ``amount`` of every output row of ``module.<name>`` by Wanda's score."""
        return super().apply(
            module, name, amount=amount, activation_norms=activation_norms, importance_scores=importance_scores
        )
