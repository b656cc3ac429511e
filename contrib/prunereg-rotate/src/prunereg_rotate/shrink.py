"""``mean_abs_sp``: a shrink method that scores with a statistic of its own (``mean_abs_input``)."""

from __future__ import annotations

import torch

from prunereg import ChannelStatistics, ShrinkMethod
from prunereg_rotate.statistic import AbsMean, MeanAbsInput


class MeanAbsSP(ShrinkMethod):
    """Channel ``j`` scores ``mean_t |x_tj| * ||W_:,j||_2``: how much it writes on an average token.

    ``x_j`` is the output projection's input channel (an MLP neuron, or one
    ``head_dim`` entry of a head) and ``W_:,j`` the projection's column that
    reads it. Against ``wanda_sp`` (the root mean square of ``x_j`` times the
    column's L1 norm) the mean absolute value weighs rare large activations
    less, and the column's L2 norm is the size of what it adds to the residual
    stream. A head (a key/value group) scores the sum of its channels' scores.
    """

    TARGETS = frozenset({"channels"})
    STATISTICS = frozenset({MeanAbsInput.NAME})

    def channel_scores(self, weight: torch.Tensor, statistics: ChannelStatistics) -> torch.Tensor:
        gathered: AbsMean | None = statistics[MeanAbsInput.NAME]
        if gathered is None:
            raise ValueError("mean_abs_sp needs calibration tokens (the statistic mean_abs_input got none)")
        return gathered.mean.to(weight.device) * torch.linalg.vector_norm(weight.float(), dim=0)
