"""The magnitude baseline: prune the smallest weights, ignoring the calibration data."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prunereg import CalibratedMethod, LayerStatistics, PrunedWeight
from prunereg.toolkit import lowest_n_of_m, lowest_overall, lowest_per_row

_SCOPES = ("row", "matrix")


class Magnitude(CalibratedMethod):
    """Prune the smallest ``|W_ij|``: within each output row (``scope="row"``) or the whole matrix.

    With a pattern ``"N:M"`` the N smallest of every M consecutive inputs of a row are
    pruned, whatever the scope. It needs no statistics: the baseline calibrated methods are judged against.
    NaN weights are pruned first in every scope and pattern, as everywhere in prunereg
    (``prunereg.toolkit.lowest_per_row``, ``lowest_overall``, ``lowest_n_of_m``).
    """

    STATISTICS = frozenset()

    def __init__(self, sparsity: float = 0.5, pattern: str | None = None, scope: str = "row") -> None:
        if scope not in _SCOPES:
            raise ValueError(f"scope must be one of {', '.join(map(repr, _SCOPES))}, not {scope!r}")
        super().__init__(sparsity, pattern)
        self.scope = scope

    def prune_group(
        self,
        weights: Sequence[torch.Tensor],
        statistics: LayerStatistics,
        sparsities: Sequence[float],
    ) -> list[PrunedWeight]:
        self.check_group(weights, statistics, sparsities)
        results = []
        for weight, sparsity in zip(weights, sparsities, strict=True):
            scores = weight.abs()
            if self.n_m is not None:
                pruned = lowest_n_of_m(scores, *self.n_m)
            elif self.scope == "row":
                pruned = lowest_per_row(scores, sparsity)
            else:
                pruned = lowest_overall(scores, sparsity)
            results.append(PrunedWeight(weight.masked_fill(pruned, 0), pruned.logical_not_()))
        return results
