"""The shrink kind: the built-in methods are registered, listed and pass the conformance check; broken ones fail."""

from __future__ import annotations

import pytest
import torch

import prunereg
from prunereg.testing import check_shrink_method

BUILT_IN = ["block_influence", "flap", "magnitude_sp", "reap", "wanda_sp"]


def test_the_built_in_shrink_methods_are_registered_as_their_own_kind() -> None:
    assert prunereg.list_methods("shrink") == BUILT_IN
    assert prunereg.info("flap").kind == "shrink"
    assert prunereg.info("magnitude").kind == "calibrated"  # the unstructured baseline keeps its name


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_shrink_method_passes_the_conformance_check(name: str) -> None:
    check_shrink_method(name)


def test_flap_without_compensation_passes_the_conformance_check_and_says_so() -> None:
    check_shrink_method("flap", compensate=False)
    assert prunereg.get("flap")(compensate=False).compensates_bias is False


class _NaNChannels(prunereg.ShrinkMethod):
    TARGETS = frozenset({"channels"})

    def channel_scores(self, weight: torch.Tensor, statistics: prunereg.ChannelStatistics) -> torch.Tensor:
        return torch.full((weight.shape[1],), float("nan"))


class _WrongShape(prunereg.ShrinkMethod):
    TARGETS = frozenset({"experts"})

    def expert_scores(self, statistics: prunereg.ExpertStatistics) -> torch.Tensor:
        return statistics.routed[:-1]


class _ChangesItsInput(prunereg.ShrinkMethod):
    TARGETS = frozenset({"channels"})

    def channel_scores(self, weight: torch.Tensor, statistics: prunereg.ChannelStatistics) -> torch.Tensor:
        return weight.abs_().sum(dim=0)


class _UnitsAsChannels(prunereg.ShrinkMethod):
    TARGETS = frozenset({"channels"})

    def channel_scores(self, weight: torch.Tensor, statistics: prunereg.ChannelStatistics) -> torch.Tensor:
        return weight.abs().sum(dim=0)

    def unit_scores(self, channel_scores: torch.Tensor, kind: str) -> torch.Tensor:
        return channel_scores.reshape(-1)


class _GlobalBlocks(prunereg.ShrinkMethod):
    TARGETS = frozenset({"blocks"})
    ALLOCATES_ACROSS_BLOCKS = True

    def block_score(self, statistics: prunereg.BlockStatistics) -> float:
        return 1.0


class _GlobalNotABool(_UnitsAsChannels):
    ALLOCATES_ACROSS_BLOCKS = "yes"  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("method", "message"),
    [
        (_UnitsAsChannels, "unit_scores must return one score per unit (5,), got (20,)"),
        (_GlobalBlocks, "ALLOCATES_ACROSS_BLOCKS ranks channel scores, and it scores no channels"),
        (_GlobalNotABool, "ALLOCATES_ACROSS_BLOCKS must be True or False"),
        (_NaNChannels, "not finite"),
        (_WrongShape, "must return a tensor of shape (6,), got (5,)"),
        (_ChangesItsInput, "changed its inputs"),
    ],
)
def test_the_conformance_check_names_the_method_and_what_it_broke(method: type, message: str) -> None:
    with pytest.raises(AssertionError, match="shrink method") as caught:
        check_shrink_method(method, devices=["cpu"])
    assert message in str(caught.value)


def test_a_class_naming_unknown_targets_is_refused_when_defined() -> None:
    with pytest.raises(TypeError, match="TARGETS names unknown entries: width"):

        class _Unknown(prunereg.ShrinkMethod):
            TARGETS = frozenset({"width"})


def test_a_calibrated_method_is_not_a_shrink_method() -> None:
    with pytest.raises(AssertionError, match="registered as kind 'calibrated', not 'shrink'"):
        check_shrink_method("wanda")
