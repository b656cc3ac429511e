"""The short cuts one pruning call takes on a small layer keep every result and error of the long way."""

from __future__ import annotations

import fractions
import math

import numpy as np
import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg.prune as prune
from prunereg import toolkit


class RecordingLinear(nn.Linear):
    """A layer whose own __setattr__ must see every assignment."""

    def __init__(self) -> None:
        super().__init__(4, 4)
        self.assigned: list[str] = []

    def __setattr__(self, name: str, value: object) -> None:
        if name != "assigned":
            self.__dict__.setdefault("assigned", []).append(name)
        super().__setattr__(name, value)


def test_a_module_with_its_own_setattr_gets_the_pruned_tensor_through_it():
    module = RecordingLinear()
    module.assigned.clear()
    prune.ln_structured(module, "weight", amount=0.5, n=2, dim=0)
    assert "weight" in module.assigned
    assert torch.equal(module.weight, module.weight_orig * module.weight_mask)


def test_the_pruned_tensor_is_a_plain_attribute_of_the_module():
    module = nn.Linear(4, 4)
    prune.ln_structured(module, "weight", amount=0.5, n=2, dim=0)
    assert "weight" in module.__dict__ and "weight" not in module._parameters and "weight" not in module._buffers
    module.weight_orig.data.mul_(2)
    module(torch.ones(1, 4))  # the hook recomputes it, in place of the old one
    assert torch.equal(module.__dict__["weight"], module.weight_orig * module.weight_mask)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("nan_at", [[], [3], [0, 5], list(range(8))])
def test_top_indices_of_nonnegative_scores_rank_nan_lowest_as_without_the_hint(largest, nan_at):
    torch.manual_seed(0)
    scores = torch.rand(8)
    scores[nan_at] = math.nan
    for k in range(9):
        hinted = toolkit.top_indices(scores, k, largest=largest, nonnegative=True)
        plain = toolkit.top_indices(scores, k, largest=largest)
        # the same ranks chosen (NaN as the lowest, -1); among equal ones either may be
        assert sorted(scores[hinted].nan_to_num(-1).tolist()) == sorted(scores[plain].nan_to_num(-1).tolist())
        if not largest:  # the k smallest: NaN first
            assert scores[hinted].isnan().sum() == min(k, len(nan_at))


def test_ln_structured_prunes_a_nan_channel_first_and_otherwise_matches_torch():
    torch.manual_seed(0)
    mine, theirs = nn.Linear(8, 6), nn.Linear(8, 6)
    theirs.load_state_dict(mine.state_dict())
    prune.ln_structured(mine, "weight", amount=2, n=2, dim=0)
    torch_prune.ln_structured(theirs, "weight", amount=2, n=2, dim=0)
    assert torch.equal(mine.weight_mask, theirs.weight_mask)
    with torch.no_grad():
        mine.weight_orig[4, 1] = math.nan
    prune.remove(mine, "weight")
    prune.ln_structured(mine, "weight", amount=3, n=2, dim=0)
    assert not mine.weight_mask[4].any() and int((mine.weight_mask.sum(1) == 0).sum()) == 3


@pytest.mark.parametrize(
    "amount",
    [0.0, 0.5, 1.0, 1.5, -0.1, 0, 3, -1, True, np.float64(0.5), np.int64(2), fractions.Fraction(1, 2), "0.5"],
)
def test_an_amount_is_accepted_or_refused_as_torch_does(amount):
    def outcome(check):
        try:
            check(amount)
        except (TypeError, ValueError) as error:
            return type(error), str(error)
        return None

    assert outcome(prune._validate_pruning_amount_init) == outcome(torch_prune._validate_pruning_amount_init)
    if outcome(torch_prune._validate_pruning_amount_init) is None:
        assert prune._compute_nparams_toprune(amount, 10) == torch_prune._compute_nparams_toprune(amount, 10)


def test_a_default_mask_of_ones_written_to_in_place_is_still_applied():
    from prunereg._selection.channels import channel_mask, ones_like, still_ones

    t = torch.randn(4, 3)
    keep = torch.tensor([0, 2])
    ones = ones_like(t)
    assert still_ones(ones) and not still_ones(torch.ones_like(t))
    assert torch.equal(channel_mask(t, keep, 0, ones), torch.tensor([[1.0] * 3, [0.0] * 3, [1.0] * 3, [0.0] * 3]))
    ones[0] = 0  # a method may change its default mask before using it
    assert not still_ones(ones)
    assert torch.equal(channel_mask(t, keep, 0, ones)[0], torch.zeros(3))


def test_a_method_that_changes_its_default_mask_in_place_gets_it_respected():
    class HalvedThenLn(prune.LnStructured):
        def compute_mask(self, t, default_mask):
            default_mask[:, 0] = 0  # prunes a column first, writing into the mask it was given
            return super().compute_mask(t, default_mask)

    module = nn.Linear(4, 4)
    HalvedThenLn.apply(module, "weight", amount=1, n=2, dim=0)
    assert not module.weight_mask[:, 0].any() and int((module.weight_mask.sum(1) == 0).sum()) == 1
