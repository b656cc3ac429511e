"""Which tensors of a model file are pruned by default, and how --include and --exclude change that."""

from __future__ import annotations

import pytest
import torch

from prunereg._files.selection import (
    EMBEDDING,
    EXCLUDED,
    FEW_DIMENSIONS,
    NORM,
    NOT_FLOATING,
    NOT_INCLUDED,
    OUTPUT_HEAD,
    ROUTER,
    role,
    select,
    shorten,
)
from tests.support.state_dicts import ENCODER_MATRICES, minilm_like


def test_a_transformer_keeps_embeddings_norms_head_and_vectors() -> None:
    selection = select(minilm_like())
    assert selection.selected == ENCODER_MATRICES
    skipped = selection.skipped
    assert skipped["embeddings.position_ids"] == NOT_FLOATING
    assert skipped["embeddings.word_embeddings.weight"] == EMBEDDING
    assert skipped["embeddings.position_embeddings.weight"] == EMBEDDING
    assert skipped["embeddings.token_type_embeddings.weight"] == EMBEDDING
    assert skipped["embeddings.LayerNorm.weight"] == NORM
    assert skipped["encoder.layer.3.output.LayerNorm.bias"] == NORM
    assert skipped["encoder.layer.3.attention.self.query.bias"] == FEW_DIMENSIONS
    assert skipped["pooler.dense.weight"] == OUTPUT_HEAD
    assert selection.total == len(minilm_like())


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("transformer.wte.weight", EMBEDDING),  # GPT-2
        ("transformer.wpe.weight", EMBEDDING),
        ("transformer.h.0.ln_1.weight", NORM),
        ("transformer.ln_f.weight", NORM),
        ("transformer.h.0.attn.c_attn.weight", None),
        ("model.embed_tokens.weight", EMBEDDING),  # Llama, Mistral, Qwen
        ("model.layers.0.input_layernorm.weight", NORM),
        ("model.layers.0.mlp.down_proj.weight", None),
        ("model.norm.weight", NORM),
        ("lm_head.weight", OUTPUT_HEAD),
        ("classifier.weight", OUTPUT_HEAD),
        ("score.weight", OUTPUT_HEAD),
        ("cls.predictions.transform.dense.weight", OUTPUT_HEAD),
        ("cls.predictions.transform.LayerNorm.weight", NORM),  # the last part that says something decides
        ("head.weight", OUTPUT_HEAD),  # timm's ViT
        ("blocks.0.attn.qkv.weight", None),
        ("layer1.0.conv1.weight", None),  # a ResNet
        ("layer1.0.bn1.weight", None),  # a 1-D tensor: skipped for its shape
        ("fc.weight", None),
        ("model.layers.0.mlp.gate.weight", ROUTER),  # Mixtral, Qwen-MoE, DeepSeek: chooses the experts
        ("model.layers.0.block_sparse_moe.gate.weight", ROUTER),  # Mixtral's checkpoints
        ("model.layers.0.mlp.router.weight", ROUTER),  # GPT-OSS
        ("model.layers.0.mlp.shared_expert_gate.weight", ROUTER),  # Qwen2-MoE
        ("model.layers.0.mlp.experts.gate_up_proj", None),  # the experts themselves
        ("model.layers.0.block_sparse_moe.experts.3.w1.weight", None),
        ("model.layers.0.mlp.gate_proj.weight", None),  # a gated MLP's projection, no router
    ],
)
def test_roles_from_names(name: str, expected: str | None) -> None:
    assert role(name) == expected


def test_small_models_are_pruned_as_before() -> None:
    tensors = {
        "a.weight": torch.ones(2, 2),
        "a.bias": torch.ones(2),
        "conv.weight": torch.ones(1, 1, 2, 2, dtype=torch.float16),
        "ids": torch.ones(2, 2, dtype=torch.int64),
        "flags": torch.ones(2, 2, dtype=torch.bool),
        "scalar": torch.tensor(1.0),
    }
    selection = select(tensors)
    assert selection.selected == ["a.weight", "conv.weight"]
    assert selection.skipped == {
        "a.bias": FEW_DIMENSIONS,
        "ids": NOT_FLOATING,
        "flags": NOT_FLOATING,
        "scalar": FEW_DIMENSIONS,
    }


def test_include_replaces_the_defaults_for_floating_point_tensors() -> None:
    tensors = minilm_like(layers=1)
    selection = select(tensors, include=["pooler.*", "embeddings.word_embeddings.weight", "embeddings.position_ids"])
    assert selection.selected == ["embeddings.word_embeddings.weight", "pooler.dense.weight", "pooler.dense.bias"]
    assert selection.skipped["embeddings.position_ids"] == NOT_FLOATING  # integers are never pruned
    assert selection.skipped["encoder.layer.0.output.dense.weight"] == NOT_INCLUDED


def test_exclude_takes_away_and_globs_are_case_sensitive() -> None:
    tensors = minilm_like(layers=2)
    selection = select(tensors, exclude=["encoder.layer.1.*"])
    assert selection.selected == ENCODER_MATRICES[:6]
    assert selection.skipped["encoder.layer.1.attention.self.query.weight"] == EXCLUDED
    assert select(tensors, include=["ENCODER.*"]).selected == []
    both = select(tensors, include=["encoder.*.weight"], exclude=["*LayerNorm*"])
    assert both.selected == ENCODER_MATRICES[:12]


def test_the_description_is_short_for_a_large_model() -> None:
    selection = select(minilm_like(layers=24))
    lines = selection.describe()
    assert len(lines) < 40  # 24 layers, 390 tensors
    assert lines[0] == "  selected 144:"
    assert "    encoder.layer.*.attention.self.query.weight (24)" in lines
    assert "  skipped 3, embedding:" in lines
    assert "  skipped 1, output head: pooler.dense.weight" not in lines
    assert "  skipped 2, output head: pooler.dense.weight, pooler.dense.bias" in lines


def test_a_small_selection_is_named_in_full_on_one_line() -> None:
    selection = select({"0.weight": torch.ones(2, 2), "0.bias": torch.ones(2), "2.weight": torch.ones(2, 2)})
    assert selection.describe() == ["  selected 2: 0.weight, 2.weight", "  skipped 1, fewer than 2 dimensions: 0.bias"]


def test_shorten_groups_layers_and_counts_the_rest() -> None:
    names = [f"h.{i}.attn.weight" for i in range(3)] + ["emb.weight"] + [f"x{i}.weight" for i in range(4)]
    assert shorten(names, 8) == names
    assert shorten(names, 5) == [
        "h.*.attn.weight (3)",
        "emb.weight",
        "x0.weight",
        "x1.weight",
        "x2.weight",
        "x3.weight",
    ]  # one over the limit: shown rather than counted
    assert shorten(names, 2) == ["h.*.attn.weight (3)", "emb.weight", "and 4 more"]


def test_why_nothing_counts_each_reason() -> None:
    selection = select({"a.bias": torch.ones(2), "ids": torch.ones(2, 2, dtype=torch.int64)}, exclude=["b*"])
    assert selection.selected == []
    assert (
        selection.why_nothing()
        == "no tensor selected: of the 2 tensors, 1 fewer than 2 dimensions, 1 not floating point"
    )
    assert select({}).why_nothing() == "no tensor selected: the file holds no tensors"
