"""Slimming without a ratio: the no-op leaves every model as it was, exact zeros go only where nothing changes, and
a channel the masks pruned but a coupled layer keeps is refused naming both layers and what couples them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunereg
from tests.slim.helpers import assert_bitwise_equal, assert_unchanged, bitwise, exact_state, outputs


class SixLines(nn.Module):
    """The issue's CNN: a residual add, then a concatenation, then a depthwise and a pointwise convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.a, self.b = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1)
        self.dw, self.pw = nn.Conv2d(12, 12, 3, padding=1, groups=12), nn.Conv2d(12, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.stem(x)))
        x = x + F.relu(self.a(x))
        x = torch.cat([x, self.b(x)], 1)
        return F.relu(self.pw(self.dw(x)))


class ConcatAndSide(nn.Module):
    """A concatenation whose input also feeds another layer (``list index out of range`` before)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.branch = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 4, 1)
        self.side, self.out = nn.Conv2d(8, 6, 1), nn.Conv2d(12, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.out(torch.cat([h, self.branch(h)], 1)) + self.side(h)


class DenseLike(nn.Module):
    """DenseNet's block: every layer reads the concatenation of all before it."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.BatchNorm2d(6 + 4 * k), nn.ReLU(), nn.Conv2d(6 + 4 * k, 4, 3, padding=1)) for k in range(3)
        )
        self.head = nn.Linear(18, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for layer in self.layers:
            x = torch.cat([x, layer(x)], 1)
        return self.head(x.mean((2, 3)))


class InceptionLike(nn.Module):
    """Inception's block: four branches of different widths concatenated, one of them after a pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.one = nn.Conv2d(8, 4, 1)
        self.three = nn.Sequential(nn.Conv2d(8, 3, 1), nn.ReLU(), nn.Conv2d(3, 5, 3, padding=1))
        self.five = nn.Sequential(nn.Conv2d(8, 2, 1), nn.ReLU(), nn.Conv2d(2, 3, 5, padding=2))
        self.pool = nn.Conv2d(8, 2, 1)
        self.head = nn.Linear(14, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        pooled = self.pool(F.max_pool2d(x, 3, stride=1, padding=1))
        x = torch.cat([self.one(x), self.three(x), self.five(x), pooled], 1)
        return self.head(x.mean((2, 3)))


class SqueezeLike(nn.Module):
    """SqueezeNet's fire module: a squeeze, then 1x1 and 3x3 expansions concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(3, 4, 1)
        self.expand1, self.expand3 = nn.Conv2d(4, 6, 1), nn.Conv2d(4, 6, 3, padding=1)
        self.classifier = nn.Conv2d(12, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.squeeze(x))
        x = torch.cat([F.relu(self.expand1(x)), F.relu(self.expand3(x))], 1)
        return self.classifier(x).mean((2, 3))


class ShuffleLike(nn.Module):
    """ShuffleNet's unit: a split, a branch, a concatenation and the channel shuffle."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.branch = nn.Sequential(
            nn.Conv2d(4, 4, 1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.Conv2d(4, 4, 1)
        )
        self.head = nn.Conv2d(8, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        kept, through = x.chunk(2, dim=1)
        x = torch.cat([kept, self.branch(through)], 1)
        b, c, h, w = x.shape
        x = x.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous().view(b, c, h, w)
        return self.head(x).mean((2, 3))


class ZeroHead(nn.Module):
    """An MLP whose output head starts at zero (timm's Mixer, torchvision's ViT)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(6, 8), nn.Linear(8, 4)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.fc(x)))


class PaddedEmbedding(nn.Module):
    """An embedding with a zero padding row, tied to the output head (Gemma2's ``pad_token_id=0``)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8, padding_idx=0)
        self.mlp = nn.Linear(8, 8)
        self.lm_head = nn.Linear(8, 10, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(F.gelu(self.mlp(self.embed(ids))))


IMAGE = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
NO_OP: dict[str, tuple[Callable[[], nn.Module], torch.Tensor]] = {
    "six_lines": (SixLines, IMAGE),
    "concat_and_side": (ConcatAndSide, IMAGE),
    "dense_like": (DenseLike, IMAGE),
    "inception_like": (InceptionLike, IMAGE),
    "squeeze_like": (SqueezeLike, IMAGE),
    "shuffle_like": (ShuffleLike, IMAGE),
    "zero_head": (ZeroHead, torch.randn(3, 6, generator=torch.Generator().manual_seed(1))),
    "padded_embedding": (PaddedEmbedding, torch.tensor([[0, 3, 5, 0, 9]])),
}


@pytest.mark.parametrize("name", NO_OP)
def test_the_no_op_leaves_every_parameter_buffer_and_output_bitwise_as_it_was(name: str) -> None:
    build, x = NO_OP[name]
    torch.manual_seed(0)
    model = build().eval()
    before, state, dense = exact_state(model), bitwise(model), outputs(model, (x,))
    with pytest.warns(UserWarning, match="slimming removed nothing"):
        report = prunereg.slim(model, x)
    assert report.removed == 0 and report.params_after == report.params_before
    assert_unchanged(model, before)
    assert_bitwise_equal(model, state)
    torch.testing.assert_close(outputs(model, (x,)), dense, rtol=0, atol=0)


def test_zeros_that_cannot_go_stay_and_are_noted_never_refused() -> None:
    torch.manual_seed(0)
    model, x = ZeroHead().eval(), torch.randn(3, 6)
    with pytest.warns(UserWarning, match="removed nothing"):
        report = prunereg.slim(model, x)
    assert "4 zero channels of 'head.weight' (dim 0) stay, as no mask pruned them: a model output keeps its shape" in (
        report.notes
    )


def test_exact_zeros_with_nothing_else_go_and_the_outputs_stay_bitwise() -> None:
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).eval(), torch.randn(4, 6)
    with torch.no_grad():  # rows made zero with their bias, then the mask removed: only the zeros say so
        model[0].weight[[1, 5]] = 0
        model[0].bias[[1, 5]] = 0
    dense = outputs(model, (x,))
    report = prunereg.slim(model, x)
    assert model[0].out_features == 6 and model[2].in_features == 6 and report.removed == 2
    torch.testing.assert_close(outputs(model, (x,)), dense, rtol=0, atol=1e-6)


def test_exact_zeros_whose_bias_still_feeds_the_next_layer_stay_with_the_outputs_bitwise() -> None:
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).eval(), torch.randn(4, 6)
    with torch.no_grad():
        model[0].weight[[1, 5]] = 0
        model[0].bias[[1, 5]] = 1.0  # relu(1) still reaches the next layer
    state, dense = bitwise(model), outputs(model, (x,))
    with pytest.warns(UserWarning, match="removed nothing"):
        report = prunereg.slim(model, x)
    assert_bitwise_equal(model, state)
    torch.testing.assert_close(outputs(model, (x,)), dense, rtol=0, atol=0)
    assert any(note.startswith("exact zeros stay: removing them would change the outputs") for note in report.notes)


# -- refusals name the coupling ------------------------------------------------------------------------------------
def _rows(layer: nn.Module, rows: list[int]) -> None:
    """Prune whole output rows of ``layer.weight`` with a mask."""
    mask = torch.ones_like(layer.weight)
    mask[rows] = 0
    prunereg.get("custom_from_mask").apply(layer, "weight", mask=mask)


class DepthwiseAfter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 1, bias=False)
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False)
        self.pw = nn.Conv2d(6, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pw(F.relu(self.dw(F.relu(self.conv(x)))))


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(4, 8, bias=False), nn.Linear(4, 8, bias=False)
        self.down_proj = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.block, self.head = nn.Linear(4, 8, bias=False), nn.Linear(8, 8, bias=False), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.head(h + F.relu(self.block(h)))


class SharedInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.left, self.right = nn.Linear(4, 8, bias=False), nn.Linear(8, 2), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.stem(x))
        return self.left(h) + self.right(h)


def _refusal(model: nn.Module, x: torch.Tensor) -> str:
    before = exact_state(model)
    with pytest.raises(prunereg.SlimError) as refused:
        prunereg.slim(model, x)
    assert_unchanged(model, before)
    assert "\n" not in str(refused.value)
    return str(refused.value)


def _shared_input_column(model: nn.Module) -> None:
    mask = torch.ones(2, 8)
    mask[:, 5] = 0
    prunereg.get("custom_from_mask").apply(model.left, "weight", mask=mask)


COUPLED: dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module], None], torch.Tensor, str]] = {
    "depthwise": (
        DepthwiseAfter,
        lambda model: _rows(model.conv, [2]),
        torch.randn(1, 3, 5, 5),
        "position 2 of 'conv.weight' (dim 0) is pruned by its mask, but 'dw.weight' keeps it (the depthwise "
        "convolution 'dw' couples them)",
    ),
    "gated_product": (
        Gated,
        lambda model: _rows(model.up_proj, [3]),
        torch.randn(2, 4),
        "position 3 of 'up_proj.weight' (dim 0) is pruned by its mask, but 'gate_proj.weight' keeps it (a gated "
        "product in the model couples them)",
    ),
    "residual_add": (
        Residual,
        lambda model: _rows(model.stem, [0]),
        torch.randn(2, 4),
        "position 0 of 'stem.weight' (dim 0) is pruned by its mask, but 'block.weight' keeps it (a residual add in "
        "the model couples them)",
    ),
    "shared_input": (
        SharedInput,
        _shared_input_column,
        torch.randn(2, 4),
        "position 5 of 'left.weight' (dim 1) is pruned by its mask, but 'right.weight' keeps it (a shared input of "
        "'left' and 'right' couples them)",
    ),
}


@pytest.mark.parametrize("coupling", COUPLED)
def test_a_masked_channel_a_coupled_layer_keeps_is_refused_naming_both_layers_and_what_couples_them(
    coupling: str,
) -> None:
    build, prune, x, expected = COUPLED[coupling]
    torch.manual_seed(0)
    model = build().eval()
    prune(model)
    assert _refusal(model, x) == f"{expected}: prune it there too, or not at all"


def test_masked_channels_a_layer_norm_counts_are_refused_as_removing_them_changes_its_statistics() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8, bias=False), nn.LayerNorm(8), nn.Linear(8, 2))
    _rows(model[0], [1, 6])
    message = _refusal(model.eval(), torch.randn(3, 4))
    assert message.startswith("removing the pruned channels changes the outputs by up to ")
    assert message.endswith(
        "from those of the same model with their entries at zero: an operation counts them (a LayerNorm's "
        "statistics, a mean over channels): prune channels that no such operation reads, or none"
    )
