"""The topologies Torch-Pruning's own tests cover, and Hugging Face models from configs, slimmed at ratio 0.5.

Each model must come out physically smaller, still run, and still give outputs of
the shapes it gave before: the channels that reach an output are never removed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import prunereg
from tests.support.slim_models import HUGGING_FACE, PEERS, Built, output_shapes, parameter_count


def _slims_at_half(build: Callable[[int], Built]) -> None:
    model, inputs = build(0)
    shapes = output_shapes(model, inputs)
    before = parameter_count(model)
    report = prunereg.slim(model, inputs, ratio=0.5)
    after = parameter_count(model)
    assert after < before, "nothing was removed"
    assert (report.params_before, report.params_after) == (before, after)
    assert output_shapes(model, inputs) == shapes
    assert any(change.after != change.before for change in report.changes)


@pytest.mark.parametrize("name", sorted(PEERS))
def test_each_peer_topology_slims_at_half_and_keeps_its_output_shapes(name: str) -> None:
    _slims_at_half(PEERS[name])


@pytest.mark.parametrize("name", sorted(HUGGING_FACE))
def test_each_tiny_hugging_face_model_slims_at_half_and_keeps_its_output_shapes(name: str) -> None:
    pytest.importorskip("transformers")
    _slims_at_half(HUGGING_FACE[name])


def test_the_slimmed_depthwise_convolutions_stay_depthwise() -> None:
    model, inputs = PEERS["concat_depthwise_residual_cnn"](0)
    prunereg.slim(model, inputs, ratio=0.5)
    depthwise = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.groups > 1]
    assert depthwise and all(m.groups == m.in_channels == m.out_channels for m in depthwise)


def test_a_slimmed_grouped_convolution_loses_whole_groups_of_equal_width() -> None:
    model, inputs = PEERS["grouped_conv"](0)
    per_group = {
        name: (m.in_channels // m.groups, m.out_channels // m.groups)
        for name, m in model.named_modules()
        if isinstance(m, nn.Conv2d) and m.groups > 1
    }
    prunereg.slim(model, inputs, ratio=0.5)
    grouped = {name: m for name, m in model.named_modules() if name in per_group}
    assert all(m.in_channels % m.groups == 0 and m.out_channels % m.groups == 0 for m in grouped.values())
    assert {name: (m.in_channels // m.groups, m.out_channels // m.groups) for name, m in grouped.items()} == per_group
    assert sum(m.out_channels for m in grouped.values()) < 2 * 32  # some groups went


def test_slimmed_multihead_attention_stays_a_consistent_module() -> None:
    model, inputs = PEERS["attention_block"](0)
    prunereg.slim(model, inputs, ratio=0.5)
    attention = model.attention
    assert attention.embed_dim == attention.num_heads * attention.head_dim
    assert tuple(attention.in_proj_weight.shape) == (3 * attention.embed_dim, attention.embed_dim)
    assert tuple(attention.out_proj.weight.shape) == (attention.embed_dim, attention.embed_dim)
    assert model.norm1.normalized_shape == (attention.embed_dim,)


class TwoBranches(nn.Module):
    """An Inception-like block: a 1x1 and a 3x3 branch concatenated, their norms on different scales."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.narrow, self.wide = nn.Conv2d(4, 8, 1), nn.Conv2d(4, 8, 3, padding=1)
        with torch.no_grad():
            self.narrow.weight.mul_(0.01)  # every 1x1 filter ranks below every 3x3 one across the block
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.narrow(x), self.wide(x)], 1).mean((2, 3)))


def test_each_branch_of_a_concatenation_loses_the_ratio_of_its_own_channels() -> None:
    model = TwoBranches().eval()
    report = prunereg.slim(model, torch.randn(1, 4, 6, 6), ratio=0.5)
    # ranked across the block, the 1x1 branch went down to one channel and the 3x3 kept all eight
    assert (model.narrow.out_channels, model.wide.out_channels, model.head.in_features) == (4, 4, 8)
    assert report.removed == 8


class _StandardizedConv(nn.Conv2d):
    """A convolution whose weight is standardized per output channel in each forward (timm's ScaledStdConv2d)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(cin, cout, 3, padding=1, bias=False)
        self.gain = nn.Parameter(torch.rand(cout, 1, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = self.weight.reshape(1, self.out_channels, -1)
        weight = nn.functional.batch_norm(flat, None, None, weight=self.gain.reshape(-1), training=True, eps=1e-5)
        return self._conv_forward(x, weight.reshape_as(self.weight), None)


def test_a_convolution_standardizing_its_weight_by_batch_norm_slims_with_its_statistics_per_channel() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        _StandardizedConv(3, 8), nn.ReLU(), _StandardizedConv(8, 8), nn.ReLU(), nn.Conv2d(8, 4, 1)
    ).eval()
    inputs = (torch.randn(2, 3, 6, 6),)
    halved = copy.deepcopy(model)
    report = prunereg.slim(halved, inputs, ratio=0.5)
    assert report.notes == [] and (halved[0].out_channels, halved[2].out_channels) == (4, 4)
    assert halved[0].gain.shape == (4, 1, 1, 1) and halved(*inputs).shape == (2, 4, 6, 6)
    prune.ln_structured(model[2], "weight", amount=0.25, n=2, dim=0)
    prune.remove(model[2], "weight")
    with torch.no_grad():
        masked = model(*inputs)
    report = prunereg.slim(model, inputs)
    assert model[2].out_channels == 6 and model[4].in_channels == 6
    with torch.no_grad():
        torch.testing.assert_close(model(*inputs), masked)


class _TransposedLinear(nn.Linear):
    """A Linear that multiplies by its weight's transpose itself (Hugging Face's FalconLinear)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T + self.bias


def test_rows_a_mask_prunes_in_a_layer_multiplying_by_its_transposed_weight_are_removed_exactly() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(_TransposedLinear(6, 8), nn.GELU(), _TransposedLinear(8, 3)).eval()
    inputs = (torch.randn(4, 6),)
    prune.ln_structured(model[0], "weight", amount=0.25, n=1, dim=0)
    prune.l1_unstructured(model[0], "bias", amount=0.0)  # the bias keeps its values; its pruned rows come next
    with torch.no_grad():
        model[0].bias_mask[model[0].weight_mask[:, 0] == 0] = 0
        masked = model(*inputs)
    report = prunereg.slim(model, inputs)
    assert report.removed == 2 and model[0].weight.shape == (6, 6) and model[2].weight.shape == (3, 6)
    with torch.no_grad():
        torch.testing.assert_close(model(*inputs), masked)
