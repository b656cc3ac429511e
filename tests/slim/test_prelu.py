"""PReLU: a slope per channel goes with its channel (its weight is an input of ``aten.prelu``, as a norm's); one
slope shared by every channel stays as it is."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import prunereg
from tests.slim.helpers import outputs


def _conv2d() -> tuple[nn.Sequential, torch.Tensor]:
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.PReLU(8), nn.Conv2d(8, 4, 3), nn.PReLU(4)), torch.randn(2, 3, 9, 9)


def _conv1d() -> tuple[nn.Sequential, torch.Tensor]:
    return nn.Sequential(nn.Conv1d(3, 8, 3), nn.PReLU(8), nn.Conv1d(8, 4, 3)), torch.randn(2, 3, 9)


def _linear() -> tuple[nn.Sequential, torch.Tensor]:
    return nn.Sequential(nn.Linear(6, 8), nn.PReLU(8), nn.Linear(8, 4)), torch.randn(5, 6)


@pytest.mark.parametrize("build", [_conv2d, _conv1d, _linear], ids=["conv2d", "conv1d", "linear"])
def test_a_per_channel_prelu_keeps_the_slopes_of_the_channels_that_stay(build) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model, x = build()
    nn.init.uniform_(model[1].weight, -1.0, 1.0)  # slopes that tell the channels apart
    layer, slopes = model[0].weight.detach().clone(), model[1].weight.detach().clone()
    report = prunereg.slim(model, x, ratio=0.5)
    assert model[0].weight.shape[0] == 4 and model[1].weight.shape == (4,) and model[1].num_parameters == 4
    kept = [next(i for i in range(8) if torch.equal(layer[i], row)) for row in model[0].weight.detach()]
    torch.testing.assert_close(model[1].weight.detach(), slopes[kept], rtol=0, atol=0)
    assert outputs(model, (x,)).shape[1] == 4 and report.removed >= 4
    assert "prelu" not in " ".join(report.notes)


def test_prelu_channels_the_masks_pruned_go_and_the_outputs_stay_the_masked_models() -> None:
    torch.manual_seed(0)
    model, x = _conv2d()
    nn.init.uniform_(model[1].weight, -1.0, 1.0)
    rows = torch.tensor([1.0, 0, 1, 0, 1, 1, 0, 0])
    prunereg.get("custom_from_mask").apply(model[0], "weight", mask=rows[:, None, None, None].expand(8, 3, 3, 3))
    prunereg.get("custom_from_mask").apply(model[0], "bias", mask=rows)
    masked = outputs(model, (x,))
    report = prunereg.slim(model, x)
    assert model[1].weight.shape == (4,) and model[2].in_channels == 4 and report.removed == 4 and not report.notes
    torch.testing.assert_close(outputs(model, (x,)), masked, rtol=0, atol=1e-6)


def test_a_prelu_with_one_shared_slope_stays_as_it_is() -> None:
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Conv2d(3, 8, 3), nn.PReLU(), nn.Conv2d(8, 4, 3)), torch.randn(1, 3, 9, 9)
    slope = model[1].weight
    prunereg.slim(model, x, ratio=0.5)
    assert model[1].weight is slope and model[1].num_parameters == 1 and model[0].out_channels == 4
