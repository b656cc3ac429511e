"""Properties over random small CNN and MLP graphs: any ratio slims to a working, smaller model of the same outputs,
masked channels go with the masked model's outputs kept, and the MACs reported are torch's flop counter's."""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import prunereg
from tests.slim.helpers import outputs

SETTINGS = settings(max_examples=12, deadline=None, derandomize=True)


class RandomMLP(nn.Module):
    """Linear layers of the drawn widths; where a block keeps its width, optionally a residual add and a LayerNorm."""

    def __init__(self, widths: list[int], residual: list[bool], norm: bool, bias: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b, bias=bias) for a, b in itertools.pairwise(widths))
        self.residual = [r and a == b for r, a, b in zip(residual, widths, widths[1:], strict=False)]
        self.norm = nn.LayerNorm(widths[-1]) if norm else nn.Identity()
        self.head = nn.Linear(widths[-1], 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, residual in zip(self.layers, self.residual, strict=True):
            y = torch.relu(layer(x))
            x = x + y if residual else y
        return self.head(self.norm(x))


class RandomCNN(nn.Module):
    """Convolutions of the drawn widths, optionally batch norm, a concatenated branch and a depthwise conv."""

    def __init__(self, widths: list[int], branch: bool, depthwise: bool, norm: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(widths):
            layers += [nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b) if norm else nn.Identity(), nn.ReLU()]
        self.trunk = nn.Sequential(*layers)
        last = widths[-1]
        self.branch = nn.Conv2d(last, 2, 1) if branch else None
        self.depthwise = nn.Conv2d(last, last, 3, padding=1, groups=last) if depthwise else nn.Identity()
        self.head = nn.Linear((last + (2 if branch else 0)) * 16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.depthwise(self.trunk(x))
        if self.branch is not None:
            h = torch.cat([h, self.branch(h)], dim=1)
        return self.head(h.flatten(1))


widths = st.lists(st.integers(2, 8), min_size=2, max_size=4)
ratios = st.floats(0.0, 0.9)


@SETTINGS
@given(widths, st.lists(st.booleans(), min_size=4, max_size=4), st.booleans(), st.booleans(), ratios, st.integers(1, 3))
def test_any_ratio_slims_a_random_mlp_to_a_working_model_no_larger_with_the_same_output_shape(
    sizes: list[int], residual: list[bool], norm: bool, bias: bool, ratio: float, round_to: int
) -> None:
    torch.manual_seed(0)
    model, x = RandomMLP([5, *sizes], residual, norm, bias).eval(), torch.randn(3, 5)
    report = prunereg.slim(model, x, ratio=ratio, round_to=round_to)
    assert outputs(model, (x,)).shape == (3, 3)
    assert report.params_after == sum(p.numel() for p in model.parameters()) <= report.params_before
    assert all(layer.out_features >= 1 for layer in model.layers)
    if ratio >= 0.5 and round_to == 1 and max(sizes) >= 4:
        assert report.params_after < report.params_before


@SETTINGS
@given(st.lists(st.integers(2, 6), min_size=1, max_size=3), st.booleans(), st.booleans(), st.booleans(), ratios)
def test_any_ratio_slims_a_random_cnn_and_the_macs_reported_are_the_flop_counters(
    sizes: list[int], branch: bool, depthwise: bool, norm: bool, ratio: float
) -> None:
    torch.manual_seed(0)
    model, x = RandomCNN([3, *sizes], branch, depthwise, norm).eval(), torch.randn(2, 3, 4, 4)
    with FlopCounterMode(display=False) as before:
        outputs(model, (x,))
    report = prunereg.slim(model, x, ratio=ratio)
    with FlopCounterMode(display=False) as after:
        assert outputs(model, (x,)).shape == (2, 4)
    assert (report.macs_before, report.macs_after) == (before.get_total_flops() // 2, after.get_total_flops() // 2)
    assert report.params_after == sum(p.numel() for p in model.parameters()) <= report.params_before


@SETTINGS
@given(st.lists(st.integers(2, 8), min_size=2, max_size=4), st.data())
def test_channels_pruned_by_random_structured_anywhere_in_a_chain_go_with_the_masked_outputs_kept(
    sizes: list[int], data: st.DataObject
) -> None:
    torch.manual_seed(0)
    model, x = RandomMLP([5, *sizes], [False] * 4, False, False).eval(), torch.randn(4, 5)
    index = data.draw(st.integers(0, len(model.layers) - 1))
    layer = model.layers[index]
    amount = data.draw(st.integers(0, layer.out_features - 1))
    prunereg.get("random_structured").apply(layer, "weight", amount=amount, dim=0)
    masked = outputs(model, (x,))
    prunereg.slim(model, x)
    assert layer.out_features == sizes[index] - amount
    torch.testing.assert_close(outputs(model, (x,)), masked, rtol=0, atol=1e-5)
