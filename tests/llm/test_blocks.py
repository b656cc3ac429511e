"""Finding a language model's decoder blocks and their prunable layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from prunereg._runtime.blocks import find_blocks, in_features, is_conv1d, prunable_layers, weight_matrix

pytest.importorskip("transformers")

from tests.support.tiny_lm import tiny_gpt2, tiny_llama, tiny_mistral, tiny_opt

LLAMA_LAYERS = [
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
]  # fmt: skip


@pytest.mark.parametrize(
    ("build", "path"),
    [(tiny_llama, "model.layers"), (tiny_mistral, "model.layers"), (tiny_gpt2, "transformer.h"),
     (tiny_opt, "model.decoder.layers")],
)  # fmt: skip
def test_the_blocks_of_each_known_architecture_are_found(build, path):
    model = build()
    found_path, blocks = find_blocks(model)
    assert found_path == path
    assert blocks is model.get_submodule(path)


def test_a_base_model_without_its_head_is_found_too():
    base = tiny_llama().model
    path, blocks = find_blocks(base)
    assert (path, blocks) == ("layers", base.layers)


def test_an_explicit_path_names_the_blocks_of_another_architecture():
    class Tower(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stack = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    tower = Tower()
    assert find_blocks(tower, "stack") == ("stack", tower.stack)
    with pytest.raises(ValueError, match=r"blocks='path\.to\.ModuleList'"):
        find_blocks(tower)
    with pytest.raises(ValueError, match="'nowhere' does not name"):
        find_blocks(tower, "nowhere")


def test_a_llama_block_prunes_its_seven_linear_layers_in_module_order():
    block = tiny_llama().model.layers[0]
    assert list(prunable_layers(block)) == LLAMA_LAYERS


def test_gpt2_conv1d_weights_are_read_in_linear_layout():
    block = tiny_gpt2().transformer.h[0]
    layers = prunable_layers(block)
    assert list(layers) == ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    c_fc = layers["mlp.c_fc"]
    assert is_conv1d(c_fc) and not is_conv1d(nn.Linear(2, 2))
    x = torch.randn(3, 32)
    expected = c_fc(x) - c_fc.bias
    assert torch.allclose(x @ weight_matrix(c_fc).T, expected, atol=1e-6)
    assert in_features(c_fc) == 32 and weight_matrix(c_fc).shape == (128, 32)
