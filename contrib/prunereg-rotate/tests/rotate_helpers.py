"""Tiny Llama models built from configs (no download), calibration ids and logits, for the package's tests."""

from __future__ import annotations

import pytest
import torch
from torch import nn

VOCABULARY = 64


def tiny_llama(seed: int = 0, **overrides: object) -> nn.Module:
    """A tiny ``LlamaForCausalLM`` in eval mode, its weights drawn from ``seed``; ``overrides`` go to its config."""
    transformers = pytest.importorskip("transformers")
    config = {
        "vocab_size": VOCABULARY, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "tie_word_embeddings": False, "initializer_range": 0.2, **overrides,
    }  # fmt: skip
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()


def token_ids(samples: int, seed: int, length: int = 16) -> torch.Tensor:
    return torch.randint(0, VOCABULARY, (samples, length), generator=torch.Generator().manual_seed(seed))


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, use_cache=False).logits
