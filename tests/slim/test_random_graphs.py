"""Properties over random small graphs of concatenations, equal splits, residual adds, gated products and depthwise
convolutions: the no-op leaves everything bitwise as it was; channels masked anywhere then slimmed give the masked
model's outputs, or a refusal that names what couples them, with the model as it was."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import event, given, settings
from hypothesis import strategies as st
from torch import nn

import prunereg
from tests.slim.helpers import assert_bitwise_equal, assert_unchanged, bitwise, exact_state, outputs

SETTINGS = settings(max_examples=15, deadline=None, derandomize=True)
KINDS = ("conv", "residual", "concat", "split", "gated", "depthwise")
REFUSALS = re.compile(
    r"is pruned by its mask, but '[^']+' keeps it \((?:a residual add|a gated product|the depthwise convolution|"
    r"a shared input|the input of|a concatenation|an equal split|aten\.)[^)]* couples them\)"
    r"|is pruned, but cannot be removed: "
    r"|every channel of '[^']+' \(dim \d\) is pruned"
)


class RandomGraph(nn.Module):
    """A 1x1 stem, then the drawn blocks (each of the drawn width where it makes new channels), a mean and a head."""

    def __init__(self, kinds: list[str], widths: list[int]) -> None:
        super().__init__()
        self.kinds = kinds
        channels = 4
        self.stem = nn.Conv2d(3, channels, 1, bias=False)
        self.blocks = nn.ModuleList()
        for kind, width in zip(kinds, widths, strict=True):
            block = nn.ModuleDict()
            if kind == "conv":
                block["conv"], channels = nn.Conv2d(channels, width, 1, bias=False), width
            elif kind == "residual":
                block["conv"] = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
            elif kind == "concat":
                block["conv"], channels = nn.Conv2d(channels, width, 1, bias=False), channels + width
            elif kind == "split":
                half = channels // 2
                block["conv"] = nn.Conv2d(half, half, 1, bias=False)
            elif kind == "gated":
                block["up"], block["gate"] = nn.Conv2d(channels, width, 1, bias=False), nn.Conv2d(channels, width, 1)
                channels = width
            else:
                block["conv"] = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
            self.blocks.append(block)
        self.head = nn.Linear(channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for kind, block in zip(self.kinds, self.blocks, strict=True):
            if kind == "residual":
                x = x + F.relu(block["conv"](x))
            elif kind == "concat":
                x = torch.cat([x, F.relu(block["conv"](x))], 1)
            elif kind == "split":
                half = x.shape[1] // 2
                first, second = x[:, : 2 * half].chunk(2, dim=1)
                x = torch.cat([F.relu(block["conv"](first)), second, x[:, 2 * half :]], 1)
            elif kind == "gated":
                x = block["up"](x) * torch.sigmoid(block["gate"](x))
            else:
                x = F.relu(block["conv"](x))
        return self.head(x.mean((2, 3)))


graphs = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(2, 6)), min_size=1, max_size=4)
IMAGE = torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(3))


def _built(blocks: list[tuple[str, int]]) -> RandomGraph:
    torch.manual_seed(0)
    return RandomGraph([kind for kind, _ in blocks], [width for _, width in blocks]).eval()


@SETTINGS
@given(graphs)
def test_the_no_op_leaves_a_random_graph_bitwise_as_it_was(blocks: list[tuple[str, int]]) -> None:
    model = _built(blocks)
    before, state, dense = exact_state(model), bitwise(model), outputs(model, (IMAGE,))
    with pytest.warns(UserWarning, match="slimming removed nothing"):
        report = prunereg.slim(model, IMAGE)
    assert report.removed == 0
    assert_unchanged(model, before)
    assert_bitwise_equal(model, state)
    torch.testing.assert_close(outputs(model, (IMAGE,)), dense, rtol=0, atol=0)


@SETTINGS
@given(graphs, st.data())
def test_rows_masked_in_any_layer_slim_to_the_masked_outputs_or_a_refusal_naming_the_coupling(
    blocks: list[tuple[str, int]], data: st.DataObject
) -> None:
    model = _built(blocks)
    layers = [(name, module) for name, module in model.named_modules() if isinstance(module, (nn.Conv2d, nn.Linear))]
    _, layer = data.draw(st.sampled_from(layers), label="layer")
    rows = layer.weight.shape[0]
    pruned = data.draw(st.sets(st.integers(0, rows - 1), min_size=1, max_size=rows), label="rows")
    mask = torch.ones_like(layer.weight)
    mask[sorted(pruned)] = 0
    prunereg.get("custom_from_mask").apply(layer, "weight", mask=mask)
    if layer.bias is not None:
        prunereg.get("custom_from_mask").apply(layer, "bias", mask=mask.flatten(1)[:, 0].clone())
    masked, before = outputs(model, (IMAGE,)), exact_state(model)
    try:
        prunereg.slim(model, IMAGE)
    except prunereg.SlimError as refusal:
        assert REFUSALS.search(str(refusal)), str(refusal)
        assert_unchanged(model, before)
        coupling = re.search(r"keeps it \((.*) couples them\)", str(refusal))
        event(f"refused: {coupling.group(1) if coupling else str(refusal).split(': ')[-1]}")
        return
    event("slimmed")
    assert layer.weight.shape[0] <= rows
    torch.testing.assert_close(outputs(model, (IMAGE,)), masked, rtol=1e-5, atol=1e-5)
