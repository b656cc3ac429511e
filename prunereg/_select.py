"""Choosing the k entries to prune: the one selection routine every method shares.

All callers go through :func:`select_k`, so a faster routine (or one that works
across processes) is a change here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def select_k(chunks: Sequence[torch.Tensor], k: int, *, largest: bool = False) -> list[torch.Tensor]:
    """Mark the ``k`` smallest (or largest) entries of all ``chunks`` taken together.

    Returns one bool tensor per chunk, of its shape, True where the entry is
    selected. Exactly ``k`` entries are selected. NaN counts as the smallest
    value, so NaN scores are pruned first (torch's ``topk`` would keep them).
    """
    flat = [chunk.reshape(-1) for chunk in chunks]
    device = flat[0].device
    scores = flat[0] if len(flat) == 1 else torch.cat([f.to(device) for f in flat])
    selected = torch.zeros(scores.shape, dtype=torch.bool, device=device)
    if k > 0:
        selected[top_indices(scores, k, largest=largest)] = True
    if len(flat) == 1:
        return [selected.view(chunks[0].shape)]
    pieces = torch.split(selected, [f.numel() for f in flat])
    return [p.view(c.shape).to(c.device) for p, c in zip(pieces, chunks)]


def top_indices(scores: torch.Tensor, k: int, *, largest: bool = False) -> torch.Tensor:
    """Flat indices of the ``k`` smallest (or largest) entries of ``scores``, NaN the smallest."""
    return torch.topk(_nan_lowest(scores.reshape(-1)), k, largest=largest).indices


def _nan_lowest(scores: torch.Tensor) -> torch.Tensor:
    if scores.is_meta or not scores.is_floating_point() or not bool(scores.isnan().any()):
        return scores
    return scores.nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))


def keep_highest_per_row(scores: torch.Tensor, alive: torch.Tensor, counts: int | torch.Tensor) -> torch.Tensor:
    """Mark, in every row along the last dim, the ``counts`` entries to keep.

    Entries still ``alive`` (bool, the shape of ``scores``) rank before pruned
    ones, so keeping ``q`` entries of a row keeps as many survivors as it can;
    among those, higher scores rank first, NaN lowest, and equal scores keep
    the lower index. ``counts`` is an int or a tensor of ``scores.shape[:-1]``.
    Row-wise methods (N:M groups, per-output-row pruning) share this ranking.
    """
    by_score = torch.sort(_nan_lowest(scores), dim=-1, descending=True, stable=True).indices
    alive_sorted = alive.gather(-1, by_score).to(torch.uint8)
    order = by_score.gather(-1, torch.sort(alive_sorted, dim=-1, descending=True, stable=True).indices)
    if isinstance(counts, torch.Tensor):
        counts = counts.unsqueeze(-1)
    rank = torch.arange(scores.shape[-1], device=scores.device)
    keep_sorted = (rank < counts).expand(order.shape)
    return torch.zeros(order.shape, dtype=torch.bool, device=scores.device).scatter_(-1, order, keep_sorted)
