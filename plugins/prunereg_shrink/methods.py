"""The shrink methods: each turns the statistics the engine gathers into one score per unit (higher: kept)."""

from __future__ import annotations

import torch

from prunereg import BlockStatistics, ChannelStatistics, ExpertStatistics, ShrinkMethod


class MagnitudeSP(ShrinkMethod):
    """Score each channel by the L2 norm of its output projection's column: the baseline, without calibration."""

    TARGETS = frozenset({"channels"})

    def channel_scores(self, weight: torch.Tensor, statistics: ChannelStatistics) -> torch.Tensor:
        return torch.linalg.vector_norm(weight, dim=0)


class WandaSP(ShrinkMethod):
    """Structured Wanda: channel j scores ``sum_i |W_ij| * ||X_j||_2`` over its output projection's column."""

    TARGETS = frozenset({"channels"})
    STATISTICS = frozenset({"channel_moments"})

    def channel_scores(self, weight: torch.Tensor, statistics: ChannelStatistics) -> torch.Tensor:
        if statistics.sq_norms is None:
            raise ValueError("wanda_sp needs the input norms of each channel (channel_moments)")
        return weight.abs().sum(dim=0) * statistics.sq_norms.to(weight.device).sqrt()


class Flap(ShrinkMethod):
    """FLAP: channel j scores its input's fluctuation ``Var(X_j)`` times ``||W_:,j||^2`` (the paper's WIFV).

    A head (a key/value group) scores the sum of its channels' squared scores,
    as the authors' code squares the attention metric; an MLP channel its score.

    With ``compensate=True`` (the paper's method) the mean contribution of each
    removed channel, ``W_:,j * mean(X_j)``, is added to the output projection's
    bias, which the config's ``mlp_bias`` / ``attention_bias`` then creates;
    ``compensate=False`` scores alone, for architectures without such a flag.
    Its scores, standardized per block, are ranked across blocks with
    ``allocation="global"`` (the paper's adaptive structure). Every block is
    observed on the dense model's activations, as the authors' code does: one
    calibration forward per block.
    """

    TARGETS = frozenset({"channels"})
    STATISTICS = frozenset({"channel_moments"})
    ALLOCATES_ACROSS_BLOCKS = True
    OBSERVES_DENSE_MODEL = True  # the authors' code feeds each block the dense block's outputs

    def __init__(self, compensate: bool = True) -> None:
        if not isinstance(compensate, bool):
            raise TypeError(f"compensate must be True or False, not {compensate!r}")
        self.compensate = compensate

    @property
    def compensates_bias(self) -> bool:
        return self.compensate

    def __repr__(self) -> str:
        return f"Flap(compensate={self.compensate})"

    def unit_scores(self, channel_scores: torch.Tensor, kind: str) -> torch.Tensor:
        return (channel_scores.square() if kind == "heads" else channel_scores).sum(dim=1)

    def channel_scores(self, weight: torch.Tensor, statistics: ChannelStatistics) -> torch.Tensor:
        if statistics.variance is None:
            raise ValueError("flap needs the variance of each input channel (channel_moments)")
        return statistics.variance.to(weight.device) * weight.square().sum(dim=0)


class BlockInfluence(ShrinkMethod):
    """ShortGPT's block influence: ``1 - cos(input, output)`` of a block, averaged over the calibration tokens."""

    TARGETS = frozenset({"blocks"})
    STATISTICS = frozenset({"block_cosine"})

    def block_score(self, statistics: BlockStatistics) -> float:
        if statistics.n_tokens == 0:
            raise ValueError("block_influence needs calibration tokens (block_cosine)")
        return 1.0 - statistics.cosine_sum / statistics.n_tokens


class Reap(ShrinkMethod):
    """REAP: an expert scores the mean, over the tokens routed to it, of routing weight x its output norm.

    An expert no calibration token reached scores 0 and goes first.
    """

    TARGETS = frozenset({"experts"})
    STATISTICS = frozenset({"expert_routing"})

    def expert_scores(self, statistics: ExpertStatistics) -> torch.Tensor:
        return statistics.weighted_norm_sum / statistics.routed.clamp(min=1)
