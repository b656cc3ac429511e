"""Hugging Face models slim with whole heads, and reload: stock from_pretrained, prunereg's, or a state dict."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import prunereg
from tests.slim.helpers import outputs
from tests.support import slim_models

pytest.importorskip("transformers")


def _qwen2() -> slim_models.Built:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval(), (torch.randint(128, (1, 8)),)


def _mistral() -> slim_models.Built:
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=64, sliding_window=None,
    )  # fmt: skip
    return MistralForCausalLM(config).eval(), (torch.randint(128, (1, 8)),)


RELOADED_BY_STOCK_TRANSFORMERS = {
    "qwen2 (biased q/k/v, grouped KV heads)": _qwen2,
    "mistral (one KV head)": _mistral,
    "llama (grouped KV heads)": slim_models.hf_smollm2_llama,
    "bert": slim_models.hf_bert,
    "vit": slim_models.hf_vit,
    "resnet": slim_models.hf_resnet50,
    "gpt2 (fused qkv, Conv1D)": slim_models.hf_gpt2,
}


@pytest.mark.parametrize("build", RELOADED_BY_STOCK_TRANSFORMERS.values(), ids=RELOADED_BY_STOCK_TRANSFORMERS.keys())
def test_a_uniformly_slimmed_model_gets_its_config_rewritten_and_stock_from_pretrained_reloads_it(
    build: Callable[[], slim_models.Built], tmp_path: Path
) -> None:
    model, inputs = build()
    report = prunereg.slim(model, inputs, ratio=0.5)
    assert report.config_rewritten and not hasattr(model.config, "prunereg_slimmed")
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    torch.testing.assert_close(outputs(reloaded, inputs), outputs(model, inputs), rtol=0, atol=1e-5)


def test_a_llama_loses_whole_kv_groups_with_their_query_heads_and_keeps_its_head_width() -> None:
    model, inputs = slim_models.hf_smollm2_llama()
    head_dim = model.model.layers[0].self_attn.head_dim
    prunereg.slim(model, inputs, ratio=0.5)
    config = model.config
    assert (config.num_attention_heads, config.num_key_value_heads) == (2, 1)
    assert config.head_dim == head_dim and config.hidden_size == 16 and config.intermediate_size == 32
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.out_features == 2 * head_dim and attention.k_proj.out_features == head_dim
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied


def test_bert_and_vit_lose_whole_heads_of_the_same_width() -> None:
    for build in (slim_models.hf_bert, slim_models.hf_vit):
        model, inputs = build()
        attention = next(m for m in model.modules() if hasattr(m, "attention_head_size") or hasattr(m, "head_dim"))
        width = getattr(attention, "attention_head_size", getattr(attention, "head_dim", None))
        prunereg.slim(model, inputs, ratio=0.5)
        assert getattr(attention, "attention_head_size", getattr(attention, "head_dim", None)) == width
        assert model.config.num_attention_heads == 2


def test_gpt2_loses_whole_heads_from_its_fused_qkv_and_its_attention_states_them() -> None:
    model, inputs = slim_models.hf_gpt2()
    prunereg.slim(model, inputs, ratio=0.5)
    attention = model.transformer.h[0].attn
    assert attention.num_heads == 2 and attention.split_size == 2 * attention.head_dim
    assert attention.c_attn.weight.shape[1] == 3 * attention.split_size


def test_per_layer_widths_go_into_the_config_and_prunereg_from_pretrained_reloads_them(tmp_path: Path) -> None:
    model, inputs = slim_models.hf_gpt2()
    report = prunereg.slim(model, inputs, ratio=0.5, ignore=["transformer.h.1.mlp"])
    assert model.transformer.h[0].mlp.c_fc.weight.shape != model.transformer.h[1].mlp.c_fc.weight.shape
    assert not report.config_rewritten and model.config.prunereg_slimmed["tensors"]
    model.save_pretrained(tmp_path)
    with pytest.raises(Exception, match="mismatch"):
        type(model).from_pretrained(tmp_path)  # stock transformers builds the config's widths
    reloaded = prunereg.from_pretrained(type(model), tmp_path)
    torch.testing.assert_close(outputs(reloaded, inputs), outputs(model, inputs), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "build", [slim_models.hf_gpt2, slim_models.concat_depthwise_residual_cnn], ids=["gpt2", "cnn with concat"]
)
def test_any_slimmed_model_reloads_from_its_state_dict_and_the_record_of_its_shapes(
    build: Callable[[], slim_models.Built],
) -> None:
    model, inputs = build()
    prunereg.slim(model, inputs, ratio=0.5)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    fresh, _ = build()
    prunereg.apply_slimmed_shapes(fresh, prunereg.slimmed_shapes(model))
    fresh.load_state_dict(state)
    torch.testing.assert_close(outputs(fresh, inputs), outputs(model, inputs), rtol=0, atol=1e-5)


def test_shapes_naming_what_a_model_lacks_are_refused_before_anything_changes() -> None:
    model, _ = slim_models.lenet()
    weight = model.state_dict()
    with pytest.raises(KeyError, match=r"nope\.weight"):
        prunereg.apply_slimmed_shapes(model, {"tensors": {"nope.weight": [1]}, "attributes": {}})
    assert all(torch.equal(weight[k], v) for k, v in model.state_dict().items())


def _swin() -> slim_models.Built:
    from transformers import SwinConfig, SwinForImageClassification

    torch.manual_seed(0)
    config = SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4, num_labels=3
    )
    return SwinForImageClassification(config).eval(), (torch.randn(1, 3, 32, 32),)


FALLBACKS = {
    "gemma (its config states the shapes but scales by sqrt(hidden_size))": slim_models.hf_gemma,
    "swin (transformers renames its keys on saving; windows, padding, patch merging)": _swin,
}


@pytest.mark.parametrize("build", FALLBACKS.values(), ids=FALLBACKS.keys())
def test_a_config_that_would_change_what_the_model_computes_is_left_and_prunereg_reloads_the_model(
    build: Callable[[], slim_models.Built], tmp_path: Path
) -> None:
    model, inputs = build()
    report = prunereg.slim(model, inputs, ratio=0.5)
    assert report.params_after < report.params_before and not report.config_rewritten
    model.save_pretrained(tmp_path)
    reloaded = prunereg.from_pretrained(type(model), tmp_path)
    assert type(reloaded) is type(model)
    torch.testing.assert_close(outputs(reloaded, inputs), outputs(model, inputs), rtol=0, atol=1e-5)
