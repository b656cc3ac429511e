"""``mean_abs_input``: per input channel of a layer, the mean over calibration tokens of ``|x_j|``.

A statistic of this plugin's own, registered through the runtime's open
protocol (:class:`prunereg.toolkit.Statistic`): the engines gather it like the
built-in ones for any method that names it in its ``STATISTICS``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prunereg import toolkit


@dataclass(frozen=True)
class AbsMean:
    """Over ``n_tokens`` tokens: ``sums[j]`` is the sum of ``|x_j|`` (float64), ``mean`` their mean (float32)."""

    n_tokens: int
    sums: torch.Tensor

    @property
    def mean(self) -> torch.Tensor:
        return (self.sums / max(self.n_tokens, 1)).float()


@toolkit.register_statistic
class MeanAbsInput(toolkit.Statistic):
    """Per input channel: the token count and the sum of ``|x_j|``, summed in float64 so that merges are exact."""

    NAME = "mean_abs_input"
    SITE = "layer_input"

    def __init__(self) -> None:
        self.n_tokens = 0
        self.sums: torch.Tensor | None = None

    def fold(self, observation: toolkit.Observation) -> None:
        rows = observation.rows()
        if rows.shape[0] == 0:
            return
        self._add(rows.shape[0], rows.abs().double().sum(dim=0))

    def combine(self, other: toolkit.Statistic) -> None:
        if not isinstance(other, MeanAbsInput):
            raise TypeError(f"MeanAbsInput combines with another MeanAbsInput, not {type(other).__name__}")
        if other.sums is not None:
            self._add(other.n_tokens, other.sums.clone())

    def _add(self, n_tokens: int, sums: torch.Tensor) -> None:
        self.n_tokens += n_tokens
        self.sums = sums if self.sums is None else self.sums.add_(sums)

    def result(self) -> AbsMean | None:
        return None if self.sums is None else AbsMean(self.n_tokens, self.sums)
