"""The lowest scores of a matrix within a scope: every row, every ``m`` consecutive entries of a row, or all.

Calibrated methods (Wanda, SparseGPT, magnitude and third-party ones) choose what
to prune this way; :mod:`prunereg.toolkit` publishes these functions. Each returns
a bool tensor of the scores' shape, True where the entry is pruned. They share
the core's rules: NaN is pruned first (it ranks below every number, ``-inf``
included: :func:`~prunereg._selection.select.nan_lowest`), equal scores are pruned
lower index first, so a result never depends on the thread count, and a share of
entries is counted by :func:`~prunereg._selection.amount.count_for`.
"""

from __future__ import annotations

import torch

from prunereg._selection.amount import count_for
from prunereg._selection.select import nan_lowest, select_k


def lowest_per_row(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """The ``sparsity`` share of lowest scores in every row of ``scores`` (``[rows, in]``), NaN first.

    Each row prunes ``count_for(sparsity, in)`` entries. Its k-th lowest score is
    found without sorting the row (about twice as fast); entries equal to it are
    taken in position order until the row has k. NaN ranks below every number.
    """
    k = count_for(sparsity, scores.shape[1])
    if not k:
        return torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    ranks = nan_lowest(scores)  # no NaN left: every comparison below is an order
    threshold = ranks.kthvalue(k, dim=1, keepdim=True).values
    pruned = ranks < threshold
    missing = k - pruned.sum(dim=1, keepdim=True)
    at_threshold = ranks == threshold
    if not torch.equal(at_threshold.sum(dim=1, keepdim=True), missing):  # ties at a threshold: leftmost first
        at_threshold.logical_and_(at_threshold.cumsum(dim=1) <= missing)
    return pruned.logical_or_(at_threshold)


def lowest_overall(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """The ``sparsity`` share of lowest scores in the whole of ``scores``, NaN first.

    ``count_for(sparsity, scores.numel())`` entries, chosen as ``select_k`` chooses them.
    """
    return select_k([scores], count_for(sparsity, scores.numel()))[0]


def lowest_n_of_m(scores: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """The ``n`` lowest scores in every ``m`` consecutive entries of each row, NaN first.

    ``scores`` is ``[rows, in]`` with ``in`` a multiple of ``m`` (the N:M
    sparsity patterns, e.g. 2:4); equal scores prune the lower index first.
    """
    rows, columns = scores.shape
    groups = nan_lowest(scores).reshape(rows, columns // m, m)
    lowest = torch.sort(groups, dim=-1, stable=True).indices[..., :n]
    pruned = torch.zeros(groups.shape, dtype=torch.bool, device=scores.device)
    return pruned.scatter_(-1, lowest, True).reshape(rows, columns)
