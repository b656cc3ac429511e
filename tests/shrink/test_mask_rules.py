"""``shrink`` ranks as masks and ``slim`` do: NaN scores go first, of equal scores the later unit goes (issue 31)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("transformers")

import torch

import prunereg
from tests.shrink.models import build, calibration_ids


class _Flat(prunereg.ShrinkMethod):
    """Every MLP channel and block scores the same, but channel 47's score (and block ``nan_block``'s) is NaN."""

    TARGETS = frozenset({"channels", "blocks"})

    def __init__(self, nan_block: int | None = None) -> None:
        self.nan_block = nan_block
        self.blocks_seen = 0

    def channel_scores(self, weight: torch.Tensor, statistics: prunereg.ChannelStatistics) -> torch.Tensor:
        scores = torch.ones(weight.shape[1])
        scores[-1] = math.nan
        return scores

    def block_score(self, statistics: prunereg.BlockStatistics) -> float:
        index, self.blocks_seen = self.blocks_seen, self.blocks_seen + 1
        return math.nan if index == self.nan_block else 0.5


def test_a_nan_channel_goes_first_and_ties_keep_the_earlier_channels() -> None:
    model = build("llama")
    down = model.model.layers[0].mlp.down_proj.weight.detach().clone()
    prunereg.shrink(model, _Flat(), calibration_ids(), mlp=0.5)
    assert torch.equal(model.model.layers[0].mlp.down_proj.weight.detach(), down[:, :24])  # 47 and 24..46 went


@pytest.mark.parametrize(("nan_block", "removed"), [(None, [2]), (0, [0])])
def test_of_equal_block_scores_the_later_block_goes_and_a_nan_block_first(
    nan_block: int | None, removed: list[int]
) -> None:
    report = prunereg.shrink(build("llama"), _Flat(nan_block), calibration_ids(), layers=1)
    assert report.removed_blocks == removed
