"""Grouped convolutions lose whole groups, or (``grouped="inside"``) the same channels inside every group, with the
number of groups kept; either way the masked outputs stay."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunereg
from tests.slim.helpers import assert_unchanged, exact_state, outputs


class Grouped(nn.Module):
    """A 1x1 convolution, a grouped 3x3 convolution of 2 groups of 4, and a 1x1 convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(3, 8, 1, bias=False)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2, bias=False)
        self.project = nn.Conv2d(8, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(F.relu(self.grouped(F.relu(self.expand(x)))))


X = torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(2))


def test_whole_groups_go_by_default_and_inside_keeps_every_group_narrower() -> None:
    torch.manual_seed(0)
    whole, inside = Grouped().eval(), Grouped().eval()
    prunereg.slim(whole, X, ratio=0.5)
    prunereg.slim(inside, X, ratio=0.5, grouped="inside")
    assert (whole.grouped.groups, whole.grouped.weight.shape[:2]) == (1, (4, 4))
    assert (inside.grouped.groups, inside.grouped.weight.shape[:2]) == (2, (4, 2))
    assert inside.expand.out_channels == inside.grouped.in_channels == 4 == inside.project.in_channels
    assert outputs(inside, (X,)).shape == (2, 3, 5, 5)


def test_the_same_channels_masked_in_every_group_go_inside_the_groups_with_the_masked_outputs() -> None:
    torch.manual_seed(0)
    model = Grouped().eval()
    for layer in (model.expand, model.grouped):
        mask = torch.ones_like(layer.weight)
        mask[[1, 5]] = 0  # channel 1 of each group
        prunereg.get("custom_from_mask").apply(layer, "weight", mask=mask)
    masked = outputs(model, (X,))
    with pytest.warns(UserWarning, match="removed nothing"):  # whole groups: the channels stay, noted
        kept = prunereg.slim(model, X)
    assert any("not entirely pruned" in note for note in kept.notes)
    report = prunereg.slim(model, X, grouped="inside")
    assert report.removed == 2 and model.grouped.groups == 2 and model.grouped.weight_orig.shape[:2] == (6, 3)
    torch.testing.assert_close(outputs(model, (X,)), masked, rtol=1e-5, atol=1e-5)


def test_an_unknown_way_to_slim_grouped_convolutions_is_refused_naming_the_choices() -> None:
    model = Grouped().eval()
    before = exact_state(model)
    with pytest.raises(ValueError, match=r"^grouped='groups' is not a way to slim grouped convolutions: 'whole' or "):
        prunereg.slim(model, X, ratio=0.5, grouped="groups")
    assert_unchanged(model, before)
