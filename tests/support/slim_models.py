"""Small models of the topologies structured pruning must follow, and Hugging Face models built from configs.

The peer topologies are the kinds of graph Torch-Pruning's own test suite
exercises (concatenations, also along a spatial dimension, splits, residual
adds, depthwise and grouped convolutions, flatten into a Linear and a Linear
viewed as channels, attention, norms, embeddings, several inputs and outputs),
written afresh. The Hugging Face builders make the
models of issue 18's benchmark from their configs, no download: tiny by
default for tests, ``full=True`` for the real shapes (benchmarks/slim.py).

Every builder returns ``(model, example_inputs)``: the model in eval mode and
a tuple of positional inputs whose first dimension is the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


def _seeded(seed: int) -> None:
    torch.manual_seed(seed)


def _conv_bn(cin: int, cout: int, kernel: int = 1, groups: int = 1, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(),
    )


# peer topologies ----------------------------------------------------------------------------------


class ConcatDepthwiseResidualCNN(nn.Module):
    """A MobileNet/Inception mix: two branches concatenated, an inverted residual block with a depthwise conv."""

    def __init__(self, width: int = 16, classes: int = 10, blocks: int = 2) -> None:
        super().__init__()
        self.stem = _conv_bn(3, width, 3, stride=2)
        self.branch_a = _conv_bn(width, width, 1)
        self.branch_b = nn.Sequential(_conv_bn(width, width // 2, 1), _conv_bn(width // 2, width, 3))
        merged = 2 * width
        self.blocks = nn.ModuleList(
            nn.Sequential(
                _conv_bn(merged, 2 * merged, 1),  # expand
                _conv_bn(2 * merged, 2 * merged, 3, groups=2 * merged),  # depthwise
                nn.Conv2d(2 * merged, merged, 1, bias=False),  # project, no activation: added to the input
                nn.BatchNorm2d(merged),
            )
            for _ in range(blocks)
        )
        self.down = _conv_bn(merged, 2 * merged, 3, stride=2)
        self.head = nn.Linear(2 * merged, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.cat([self.branch_a(x), self.branch_b(x)], dim=1)
        for block in self.blocks:
            x = x + block(x)
        x = self.down(x)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def concat_depthwise_residual_cnn(seed: int = 0, *, full: bool = False) -> Built:
    """Full: width 32 at 224 x 224, 1000 classes (0.25M parameters, 0.76 GMACs); tiny: width 8 at 16 x 16."""
    _seeded(seed)
    width, image, classes = (32, 224, 1000) if full else (8, 16, 10)
    return ConcatDepthwiseResidualCNN(width, classes).eval(), (torch.randn(1, 3, image, image),)


class CascadedConcat(nn.Module):
    """Concatenations of concatenations: four branches of different widths joined in three steps."""

    def __init__(self, width: int = 6, classes: int = 5) -> None:
        super().__init__()
        self.one = nn.Sequential(_conv_bn(width, width), _conv_bn(width, width))
        self.two = nn.Sequential(_conv_bn(width, 2 * width), _conv_bn(2 * width, 2 * width))
        self.three = _conv_bn(width, 3 * width)
        self.four = _conv_bn(width, 6 * width)
        self.out = nn.Conv2d(12 * width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        joined = torch.cat([torch.cat([torch.cat([self.one(x), self.two(x)], 1), self.three(x)], 1), self.four(x)], 1)
        return self.out(joined)


def cascaded_concat(seed: int = 0) -> Built:
    _seeded(seed)
    return CascadedConcat().eval(), (torch.randn(1, 6, 7, 7),)


class SplitConcatResidual(nn.Module):
    """A tensor split in two: one part concatenated with a parallel path, the other added back at the end."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.width = width
        self.trunk = nn.Sequential(_conv_bn(width, width), _conv_bn(width, 2 * width))
        self.parallel = nn.Sequential(_conv_bn(width, width), _conv_bn(width, width))
        self.merge = _conv_bn(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        side = self.parallel(x)
        first, second = torch.split(self.trunk(x), [self.width, self.width], dim=1)
        return self.merge(torch.cat([first, side], dim=1)) + second


def split_concat_residual(seed: int = 0) -> Built:
    _seeded(seed)
    return SplitConcatResidual().eval(), (torch.randn(1, 8, 6, 6),)


class SpatialConcatSplit(nn.Module):
    """Two branches concatenated along the height, not the channels, then split back: both keep equal widths."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.one = nn.Sequential(_conv_bn(width, width), _conv_bn(width, width))
        self.two = nn.Sequential(_conv_bn(width, width), _conv_bn(width, width))
        self.mix = nn.Conv2d(width, width, 1)
        self.out = nn.Conv2d(width, width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        one, two = self.one(x), self.two(x)
        top, _ = torch.split(self.mix(torch.cat([one, two], dim=2)), [one.shape[2], two.shape[2]], dim=2)
        return self.out(top)


def spatial_concat_split(seed: int = 0) -> Built:
    _seeded(seed)
    return SpatialConcatSplit().eval(), (torch.randn(1, 8, 5, 5),)


class UnflattenIntoTransposedConv(nn.Module):
    """A Linear viewed as channels x 4 x 4 (the width read from the next layer) into transposed convolutions."""

    def __init__(self, features: int = 12, classes: int = 5) -> None:
        super().__init__()
        self.fc = nn.Linear(features, 16 * 4 * 4)
        self.up1 = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
        self.up2 = nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
        self.head = nn.Linear(4 * 16 * 16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc(x)).view(-1, self.up1.in_channels, 4, 4)
        x = F.relu(self.up2(F.relu(self.up1(x))))
        return self.head(torch.flatten(x, 1))


def unflatten_into_transposed_conv(seed: int = 0) -> Built:
    _seeded(seed)
    return UnflattenIntoTransposedConv().eval(), (torch.randn(2, 12),)


class SplitThreeWays(nn.Module):
    """One conv's output split into three unequal parts; two go through the same block: three outputs."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.width = width
        self.trunk = nn.Sequential(_conv_bn(width, width), _conv_bn(width, 4 * width))
        self.shared = _conv_bn(width, width)
        self.wide = _conv_bn(2 * width, width)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, b, c = torch.split(self.trunk(x), [self.width, self.width, 2 * self.width], dim=1)
        return self.shared(a), self.shared(b), self.wide(c)


def split_three_ways(seed: int = 0) -> Built:
    _seeded(seed)
    return SplitThreeWays().eval(), (torch.randn(1, 8, 5, 5),)


class GatedChunkMLP(nn.Module):
    """A gated MLP whose up-projection is chunked in two halves (GLU style): both halves lose the same units."""

    def __init__(self, features: int = 12, hidden: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.up = nn.Linear(features, 2 * hidden)
        self.down = nn.Linear(hidden, features)
        self.head = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.up(x).chunk(2, dim=-1)
        return self.head(x + self.down(F.silu(gate) * value))


def gated_chunk_mlp(seed: int = 0) -> Built:
    _seeded(seed)
    return GatedChunkMLP().eval(), (torch.randn(2, 12),)


class GroupedConvNet(nn.Module):
    """Grouped convolutions (4 groups): channels go in groups, so each group loses its share."""

    def __init__(self, width: int = 16, groups: int = 4, classes: int = 6) -> None:
        super().__init__()
        self.stem = _conv_bn(3, width, 3)
        self.grouped = _conv_bn(width, 2 * width, 3, groups=groups)
        self.grouped_again = _conv_bn(2 * width, 2 * width, 1, groups=groups)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.grouped_again(self.grouped(self.stem(x)))
        return self.head(x.mean(dim=(2, 3)))


def grouped_conv(seed: int = 0) -> Built:
    _seeded(seed)
    return GroupedConvNet().eval(), (torch.randn(1, 3, 8, 8),)


class Conv1dNet(nn.Module):
    """A 1-d signal net: Conv1d, BatchNorm1d, a residual add, global pooling, a Linear head."""

    def __init__(self, channels: int = 4, width: int = 12, classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv1d(channels, width, 5, padding=2), nn.BatchNorm1d(width), nn.ReLU())
        self.body = nn.Sequential(nn.Conv1d(width, width, 3, padding=1), nn.BatchNorm1d(width), nn.ReLU())
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.body(x)
        return self.head(x.amax(dim=-1))


def conv1d_net(seed: int = 0) -> Built:
    _seeded(seed)
    return Conv1dNet().eval(), (torch.randn(2, 4, 20),)


class Conv3dNet(nn.Module):
    """A video/volume net: Conv3d and BatchNorm3d twice, then flatten into a Linear."""

    def __init__(self, width: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv3d(2, width, 3, padding=1),
            nn.BatchNorm3d(width),
            nn.ReLU(),
            nn.Conv3d(width, width, 3, stride=2, padding=1),
            nn.BatchNorm3d(width),
            nn.ReLU(),
        )
        self.head = nn.Linear(width * 2 * 2 * 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.body(x), 1))


def conv3d_net(seed: int = 0) -> Built:
    _seeded(seed)
    return Conv3dNet().eval(), (torch.randn(1, 2, 4, 4, 4),)


class ResidualMLP(nn.Module):
    """Three Linear layers, the middle one with a skip connection around it."""

    def __init__(self, features: int = 16, hidden: int = 32, classes: int = 5) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x))
        x = x + F.relu(self.fc2(x))
        return self.fc3(x)


def residual_mlp(seed: int = 0) -> Built:
    _seeded(seed)
    return ResidualMLP().eval(), (torch.randn(3, 16),)


class WideAndDeep(nn.Module):
    """An MLP with BatchNorm1d beside a wide Linear, their outputs concatenated on the last dimension."""

    def __init__(self, features: int = 12) -> None:
        super().__init__()
        self.deep = nn.Sequential(
            nn.Linear(features, 16), nn.BatchNorm1d(16), nn.ReLU(),
            nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(),
            nn.Linear(8, 1),
        )  # fmt: skip
        self.wide = nn.Linear(features, 3)
        self.out = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1)
        return torch.sigmoid(self.out(torch.cat([self.wide(x), self.deep(x)], dim=-1)))


def wide_and_deep(seed: int = 0) -> Built:
    _seeded(seed)
    return WideAndDeep().eval(), (torch.randn(4, 3, 4),)


class TwoInputsTwoOutputs(nn.Module):
    """Two inputs through their own Linear, concatenated into a third; a second head reads the first branch."""

    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Linear(12, 8)
        self.right = nn.Linear(6, 8)
        self.joined = nn.Linear(16, 10)
        self.aux = nn.Linear(8, 3)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        left, right = F.relu(self.left(x1)), F.relu(self.right(x2))
        return self.joined(torch.cat([left, right], dim=1)), self.aux(left)


def two_inputs_two_outputs(seed: int = 0) -> Built:
    _seeded(seed)
    return TwoInputsTwoOutputs().eval(), (torch.randn(2, 12), torch.randn(2, 6))


class LeNet(nn.Module):
    """LeNet-5: convolutions and pooling, then a flatten into Linear layers (each channel is 4 x 4 inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.view(x.shape[0], -1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def lenet(seed: int = 0) -> Built:
    _seeded(seed)
    return LeNet().eval(), (torch.randn(2, 1, 28, 28),)


class SingleChannelOutput(nn.Module):
    """A fully convolutional net whose last conv has one output channel (a mask or depth head)."""

    def __init__(self) -> None:
        super().__init__()
        self.one = _conv_bn(3, 8, 3)
        self.two = nn.Sequential(nn.Conv2d(8, 16, 2, stride=2), nn.BatchNorm2d(16), nn.ReLU())
        self.three = nn.Sequential(nn.Conv2d(16, 1, 3, padding=1), nn.BatchNorm2d(1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.three(self.two(self.one(x)))


def single_channel_output(seed: int = 0) -> Built:
    _seeded(seed)
    return SingleChannelOutput().eval(), (torch.randn(1, 3, 8, 8),)


class ScaledFeatures(nn.Module):
    """Parameters used outside any layer: a per-feature scale and shift between two Linear layers."""

    def __init__(self, features: int = 10, hidden: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.scale = nn.Parameter(torch.rand(hidden) + 0.5)
        self.shift = nn.Parameter(torch.randn(hidden) * 0.1)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x))
        return self.fc2(x * self.scale + self.shift)


def scaled_features(seed: int = 0) -> Built:
    _seeded(seed)
    return ScaledFeatures().eval(), (torch.randn(2, 10),)


class AttentionBlock(nn.Module):
    """A transformer encoder block built from nn.MultiheadAttention (batch first), LayerNorm and an MLP."""

    def __init__(self, dim: int = 16, heads: int = 4, hidden: int = 32, classes: int = 5) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm1 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.norm2 = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attention(x, x, x, need_weights=False)
        x = self.norm1(x + attended)
        x = self.norm2(x + self.mlp(x))
        return self.head(x.mean(dim=1))


def attention_block(seed: int = 0) -> Built:
    _seeded(seed)
    return AttentionBlock().eval(), (torch.randn(2, 6, 16),)


class LayerNormMLP(nn.Module):
    """Pre-norm residual MLP blocks on a token sequence: LayerNorm couples the residual stream's width."""

    def __init__(self, features: int = 8, dim: int = 16, blocks: int = 2, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(features, dim)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(blocks))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)) for _ in range(blocks)
        )
        self.final_norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for norm, mlp in zip(self.norms, self.mlps):
            x = x + mlp(norm(x))
        return self.head(self.final_norm(x))


def layer_norm_mlp(seed: int = 0) -> Built:
    _seeded(seed)
    return LayerNormMLP().eval(), (torch.randn(2, 5, 8),)


class GroupNormCNN(nn.Module):
    """Convolutions normalised by GroupNorm (4 groups): channels go in whole groups."""

    def __init__(self, width: int = 16, groups: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.GroupNorm(groups, width), nn.SiLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.GroupNorm(groups, 2 * width), nn.SiLU(),
        )  # fmt: skip
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean(dim=(2, 3)))


def group_norm_cnn(seed: int = 0) -> Built:
    _seeded(seed)
    return GroupNormCNN().eval(), (torch.randn(1, 3, 8, 8),)


class EmbeddingClassifier(nn.Module):
    """Token embeddings, a mean over the sequence, a hidden Linear and a head: the embedding width is prunable."""

    def __init__(self, vocab: int = 50, dim: int = 16, hidden: int = 24, classes: int = 4) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.hidden(self.embedding(ids).mean(dim=1))))


def embedding_classifier(seed: int = 0) -> Built:
    _seeded(seed)
    return EmbeddingClassifier().eval(), (torch.randint(0, 50, (2, 7)),)


PEERS: dict[str, Callable[[int], Built]] = {
    "concat_depthwise_residual_cnn": concat_depthwise_residual_cnn,
    "cascaded_concat": cascaded_concat,
    "split_concat_residual": split_concat_residual,
    "spatial_concat_split": spatial_concat_split,
    "unflatten_into_transposed_conv": unflatten_into_transposed_conv,
    "split_three_ways": split_three_ways,
    "gated_chunk_mlp": gated_chunk_mlp,
    "grouped_conv": grouped_conv,
    "conv1d_net": conv1d_net,
    "conv3d_net": conv3d_net,
    "residual_mlp": residual_mlp,
    "wide_and_deep": wide_and_deep,
    "two_inputs_two_outputs": two_inputs_two_outputs,
    "lenet": lenet,
    "single_channel_output": single_channel_output,
    "scaled_features": scaled_features,
    "attention_block": attention_block,
    "layer_norm_mlp": layer_norm_mlp,
    "group_norm_cnn": group_norm_cnn,
    "embedding_classifier": embedding_classifier,
}
"""Each peer topology by name: ``PEERS[name](seed)`` gives ``(model, example_inputs)``."""


# Hugging Face models from configs ---------------------------------------------------------------

TEXT_LENGTH = {False: 8, True: 128}
"""Tokens per example input: tiny models take 8, full-size ones a 128-token sequence."""


def _tokens(vocab: int, full: bool) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, vocab, (1, TEXT_LENGTH[full])),)


def hf_gemma(seed: int = 0) -> Built:
    """A tiny Gemma: its config can state slimmed widths, but it scales the embeddings by sqrt(hidden_size)."""
    from transformers import GemmaConfig, GemmaForCausalLM

    _seeded(seed)
    config = GemmaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    return GemmaForCausalLM(config).eval(), (torch.randint(128, (1, 8)),)


def hf_resnet50(seed: int = 0, *, full: bool = False) -> Built:
    """ResNet-50 (ResNetConfig's defaults, 1000 classes) at 224 x 224; tiny: two bottleneck stages at 32 x 32."""
    from transformers import ResNetConfig, ResNetForImageClassification

    _seeded(seed)
    if full:
        config, image = ResNetConfig(num_labels=1000), 224
    else:
        config, image = ResNetConfig(embedding_size=8, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10), 32
    return ResNetForImageClassification(config).eval(), (torch.randn(1, 3, image, image),)


def hf_vit(seed: int = 0, *, full: bool = False) -> Built:
    """ViT-B/16 shapes (ViTConfig's defaults, 1000 classes); tiny: 2 layers of width 32, 4 heads, 32 x 32 images."""
    from transformers import ViTConfig, ViTForImageClassification

    _seeded(seed)
    if full:
        config = ViTConfig(num_labels=1000)
    else:
        config = ViTConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            image_size=32, patch_size=8, num_labels=10,
        )  # fmt: skip
    image = config.image_size
    return ViTForImageClassification(config).eval(), (torch.randn(1, 3, image, image),)


def hf_bert(seed: int = 0, *, full: bool = False) -> Built:
    """BERT-base shapes (BertConfig's defaults) with a 2-class sequence classifier; tiny: width 32, 2 layers."""
    from transformers import BertConfig, BertForSequenceClassification

    _seeded(seed)
    if full:
        config = BertConfig(num_labels=2)
    else:
        config = BertConfig(
            vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, num_labels=2,
        )  # fmt: skip
    return BertForSequenceClassification(config).eval(), _tokens(config.vocab_size, full)


def hf_smollm2_llama(seed: int = 0, *, full: bool = False) -> Built:
    """A Llama with SmolLM2-135M's shapes: 30 layers of width 576, 9 heads over 3 KV heads, tied embeddings.

    Tiny: 2 layers of width 32, 4 heads over 2 KV heads, still grouped and tied.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    _seeded(seed)
    if full:
        config = LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
            rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
        )  # fmt: skip
    else:
        config = LlamaConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
        )  # fmt: skip
    return LlamaForCausalLM(config).eval(), _tokens(config.vocab_size, full)


def hf_gpt2(seed: int = 0, *, full: bool = False) -> Built:
    """GPT-2 small (GPT2Config's defaults: Conv1D projections, fused QKV); tiny: width 32, 2 layers, 4 heads."""
    from transformers import GPT2Config, GPT2LMHeadModel

    _seeded(seed)
    config = (
        GPT2Config()
        if full
        else GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
    )
    return GPT2LMHeadModel(config).eval(), _tokens(config.vocab_size, full)


def hf_mixtral(seed: int = 0, *, full: bool = False) -> Built:
    """A Mixtral (4 experts, 2 per token), which transformers 5 holds fused and saves one module per expert."""
    from transformers import MixtralConfig, MixtralForCausalLM

    _seeded(seed)
    config = MixtralConfig(
        vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
    )  # fmt: skip
    return MixtralForCausalLM(config).eval(), _tokens(config.vocab_size, full)


def hf_qwen3_moe(seed: int = 0, *, full: bool = False) -> Built:
    """A Qwen3-MoE (4 experts of width 24, q/k norms), saved one module per expert as its checkpoints are."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    _seeded(seed)
    config = Qwen3MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=40, moe_intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64, num_experts=4,
        num_experts_per_tok=2,
    )  # fmt: skip
    return Qwen3MoeForCausalLM(config).eval(), _tokens(config.vocab_size, full)


HUGGING_FACE: dict[str, Callable[..., Built]] = {
    "hf_resnet50": hf_resnet50,
    "hf_vit": hf_vit,
    "hf_bert": hf_bert,
    "hf_smollm2_llama": hf_smollm2_llama,
    "hf_gpt2": hf_gpt2,
}
"""Each Hugging Face builder by name: ``HUGGING_FACE[name](seed, full=...)``."""


# helpers ----------------------------------------------------------------------------------------


def batched(inputs: tuple[torch.Tensor, ...], batch: int) -> tuple[torch.Tensor, ...]:
    """The example inputs repeated along their first dimension to ``batch`` rows (a latency at that batch size)."""
    return tuple(tensor[:1].repeat(batch, *[1] * (tensor.dim() - 1)) for tensor in inputs)


def output_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors a forward returned, in order: a tensor, a tuple/list of them, or a Hugging Face ModelOutput."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):  # ModelOutput is an OrderedDict of the fields it has
        return [tensor for value in output.values() for tensor in output_tensors(value)]
    if isinstance(output, (tuple, list)):
        return [tensor for value in output for tensor in output_tensors(value)]
    return []


def output_shapes(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[tuple[int, ...]]:
    """The shapes of everything ``model(*inputs)`` returns, under no_grad."""
    with torch.no_grad():
        return [tuple(tensor.shape) for tensor in output_tensors(model(*inputs))]


def parameter_count(model: nn.Module) -> int:
    """Parameters, each shared (tied) tensor counted once."""
    return sum(parameter.numel() for parameter in model.parameters())
