"""Wanda (Sun et al. 2023): prune the weights whose magnitude times input norm is lowest."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prunereg import CalibratedMethod, LayerStatistics, PrunedWeight
from prunereg.toolkit import lowest_n_of_m, lowest_per_row


def wanda_scores(weight: torch.Tensor, input_norms: torch.Tensor) -> torch.Tensor:
    """``|W_ij| * ||X_j||``: the paper's importance of each weight (``input_norms`` already square-rooted)."""
    return weight.abs().mul_(input_norms)


class Wanda(CalibratedMethod):
    """Prune ``|W_ij| * ||X_j||_2`` lowest first, compared within each output row.

    With a pattern ``"N:M"`` the N lowest of every M consecutive inputs of a row are
    pruned instead. The kept weights are not changed. A NaN score (a NaN weight or
    input norm) is pruned first, as everywhere in prunereg.
    """

    STATISTICS = frozenset({"input_sq_norms"})

    def prune_group(
        self,
        weights: Sequence[torch.Tensor],
        statistics: LayerStatistics,
        sparsities: Sequence[float],
    ) -> list[PrunedWeight]:
        self.check_group(weights, statistics, sparsities)
        assert statistics.input_sq_norms is not None  # check_group made sure
        input_norms = statistics.input_sq_norms.to(weights[0].device).sqrt()
        results = []
        for weight, sparsity in zip(weights, sparsities, strict=True):
            scores = wanda_scores(weight, input_norms)
            pruned = lowest_per_row(scores, sparsity) if self.n_m is None else lowest_n_of_m(scores, *self.n_m)
            results.append(PrunedWeight(weight.masked_fill(pruned, 0), pruned.logical_not_()))
        return results
