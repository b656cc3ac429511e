"""``slim`` counts, ranks and breaks ties as masks do: one vocabulary with ``ln_structured`` (issue 31 item 5).

A ratio removes ``round(ratio * n)`` units of a group (half to even, torch's
rule for a float ``amount``), NaN scores go first, and of equal scores the later
unit goes (the earlier is kept): :func:`prunereg._selection.select.removal_order`.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import prunereg


def _mlp(width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, width), nn.ReLU(), nn.Linear(width, 2))


def _ln_structured_pruned(weight: torch.Tensor, ratio: float) -> list[int]:
    layer = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        layer.weight.copy_(weight)
    prunereg.get("ln_structured").apply(layer, "weight", amount=ratio, n=2, dim=0)
    return (layer.weight_mask.sum(1) == 0).nonzero().flatten().tolist()


@pytest.mark.parametrize(("width", "ratio", "removed"), [(5, 0.3, 2), (5, 0.5, 2), (5, 0.7, 4), (4, 0.125, 0)])
def test_a_ratio_removes_the_count_ln_structured_prunes(width: int, ratio: float, removed: int) -> None:
    model = _mlp(width)
    assert len(_ln_structured_pruned(model[0].weight.detach(), ratio)) == removed
    with _quiet():
        report = prunereg.slim(model, torch.randn(2, 3), ratio=ratio)
    assert report.removed == removed and model[0].out_features == width - removed


@settings(max_examples=25, deadline=None)
@given(width=st.integers(2, 12), ratio=st.floats(0, 0.99))
def test_every_ratio_counts_as_torch_counts_a_float_amount(width: int, ratio: float) -> None:
    model = _mlp(width)
    expected = min(round(ratio * width), width - 1)  # a group keeps one unit
    with _quiet():
        prunereg.slim(model, torch.randn(2, 3), ratio=ratio)
    assert model[0].out_features == width - expected
    assert math.isclose(round(ratio * width), len(_ln_structured_pruned(_mlp(width)[0].weight.detach(), ratio)))


def test_a_channel_with_a_nan_score_is_removed_first_as_masks_prune_it() -> None:
    model = _mlp(5)
    with torch.no_grad():
        model[0].weight.mul_(100.0)
        model[0].weight[2, 0] = math.nan  # by far the largest channel otherwise
    assert _ln_structured_pruned(model[0].weight.detach(), 0.2) == [2]
    kept = model[0].weight.detach()[[0, 1, 3, 4]].clone()
    prunereg.slim(model, torch.randn(2, 3), ratio=0.2)
    assert torch.equal(model[0].weight.detach(), kept)


def test_of_equal_scores_the_later_unit_goes_and_the_earlier_stays() -> None:
    model = _mlp(4)
    rows = torch.tensor([[1.0, 2.0, 3.0], [3.0, 1.0, 2.0], [2.0, 3.0, 1.0], [1.0, 3.0, 2.0]])  # one norm, told apart
    with torch.no_grad():
        model[0].weight.copy_(rows)
        model[0].bias.zero_()
        model[2].weight.fill_(1.0)
    prunereg.slim(model, torch.randn(2, 3), ratio=0.5)
    assert torch.equal(model[0].weight.detach(), rows[:2])


def _quiet() -> contextlib.AbstractContextManager[None]:
    """Some ratios remove nothing of a small group, which warns: not what these tests look at."""
    return warnings.catch_warnings(action="ignore")
