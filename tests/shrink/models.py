"""Tiny causal LMs of every architecture ``prunereg.shrink`` supports, built from configs (no download)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.support.tiny_lm import VOCAB, calibration_ids, tiny_gpt2, tiny_llama, tiny_mistral, tiny_opt

__all__ = ["ARCHITECTURES", "VOCAB", "build", "calibration_ids", "tiny_llama"]

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128, "tie_word_embeddings": False,
}  # fmt: skip


def _from_config(config_class: str, model_class: str, seed: int, **overrides: Any) -> nn.Module:
    import transformers

    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**{**_COMMON, **overrides})
    model: nn.Module = getattr(transformers, model_class)(config)
    return model.eval()


def tiny_qwen2(seed: int = 0) -> nn.Module:
    return _from_config("Qwen2Config", "Qwen2ForCausalLM", seed)


def tiny_phi3(seed: int = 0) -> nn.Module:
    return _from_config("Phi3Config", "Phi3ForCausalLM", seed, pad_token_id=0)


def tiny_mixtral(seed: int = 0) -> nn.Module:
    return _from_config("MixtralConfig", "MixtralForCausalLM", seed, num_local_experts=4, num_experts_per_tok=2)


def tiny_qwen2_moe(seed: int = 0) -> nn.Module:
    return _from_config(
        "Qwen2MoeConfig", "Qwen2MoeForCausalLM", seed, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=24,
    )  # fmt: skip


def tiny_olmo2(seed: int = 0) -> nn.Module:
    """OLMo-2 normalizes all query heads together (``q_norm`` over ``num_heads * head_dim``): heads cannot go."""
    return _from_config("Olmo2Config", "Olmo2ForCausalLM", seed)


def _llama(seed: int = 0) -> nn.Module:
    return tiny_llama(seed, layers=3)


def _gpt2(seed: int = 0) -> nn.Module:
    return tiny_gpt2(seed)


ARCHITECTURES = {
    "llama": _llama,
    "qwen2": tiny_qwen2,
    "mistral": tiny_mistral,
    "phi3": tiny_phi3,
    "gpt2": _gpt2,
    "opt": tiny_opt,
    "opt-without-biases": lambda seed=0: _from_config(
        "OPTConfig", "OPTForCausalLM", seed, ffn_dim=48, word_embed_proj_dim=32, enable_bias=False
    ),
    "mixtral": tiny_mixtral,
    "qwen2_moe": tiny_qwen2_moe,
    "olmo2": tiny_olmo2,
}


def build(architecture: str, seed: int = 0) -> nn.Module:
    return ARCHITECTURES[architecture](seed)
