"""Which entries of a score matrix to prune: per row, per matrix, or N of every M inputs.

Every function returns a bool tensor of the scores' shape, True where the entry is
pruned (the lowest scores). Ties are broken by position: the lower index is pruned
first, so a result never depends on the thread count.
"""

from __future__ import annotations

import torch

from prunereg.toolkit import select_k


def count_for(sparsity: float, units: int) -> int:
    """How many of ``units`` entries a ``sparsity`` prunes: the nearest whole number."""
    return round(sparsity * units)


def lowest_per_row(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """The ``sparsity`` share of lowest scores in every row of ``scores`` (``[rows, in]``).

    Each row's k-th lowest score is found without sorting the row (about twice as
    fast); entries equal to it are taken in position order until the row has k.
    NaN ranks above every number, as in a sort.
    """
    k = count_for(sparsity, scores.shape[1])
    if not k:
        return torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    threshold = scores.kthvalue(k, dim=1, keepdim=True).values
    if threshold.isnan().any():  # NaN compares false with everything: sort, which ranks NaN highest
        lowest = torch.sort(scores, dim=1, stable=True).indices[:, :k]
        return torch.zeros(scores.shape, dtype=torch.bool, device=scores.device).scatter_(1, lowest, True)
    pruned = scores < threshold
    missing = k - pruned.sum(dim=1, keepdim=True)
    at_threshold = scores == threshold
    if not torch.equal(at_threshold.sum(dim=1, keepdim=True), missing):  # ties at a threshold: leftmost first
        at_threshold.logical_and_(at_threshold.cumsum(dim=1) <= missing)
    return pruned.logical_or_(at_threshold)


def lowest_overall(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """The ``sparsity`` share of lowest scores in the whole of ``scores``."""
    return select_k([scores], count_for(sparsity, scores.numel()))[0]


def lowest_n_of_m(scores: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """The ``n`` lowest scores in every ``m`` consecutive entries of each row (``[rows, in]``, ``in % m == 0``)."""
    rows, columns = scores.shape
    groups = scores.reshape(rows, columns // m, m)
    lowest = torch.sort(groups, dim=-1, stable=True).indices[..., :n]
    pruned = torch.zeros(groups.shape, dtype=torch.bool, device=scores.device)
    return pruned.scatter_(-1, lowest, True).reshape(rows, columns)
