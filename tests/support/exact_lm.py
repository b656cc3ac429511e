"""Tiny Llama and Mixtral models whose calibration activations are exact in float32, float16 and bfloat16.

Half precision may only be asked to choose what float32 chooses on the same
values, so these models make every value a statistic reads the same in all three
dtypes, while the weights stay free enough for scores to differ:

- the hidden size is 16 (a power of four) and every token's embedding is ``+-e_i``:
  the RMS of a one-hot stream is ``1/4``, so ``RMSNorm`` (``rms_norm_eps`` 0)
  gives exactly ``+-4 e_i`` times its weight, in every dtype;
- a Linear reading a one-hot vector makes single products (no sums), and small
  integers times powers of two keep them exact; ``relu`` (``hidden_act``) is exact;
- calibration sequences are one token long, so attention's softmax is exactly 1
  and its output is the value vector; the two query heads of each key/value
  group have output projections of opposite signs, so attention adds exactly 0
  to the residual stream while every head still has its own score;
- :func:`flipping_llama` keeps the stream one-hot through any number of blocks:
  each MLP channel reads one coordinate and flips the sign of its class of
  tokens (coordinate and sign), or does nothing, so a block's input/output cosine
  is exactly +-1 per token.

Every model is built in float32 from ``seed``; ``.to(dtype)`` changes no value.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TypeVar

import torch
from hypothesis import strategies as st
from torch import nn

from tests.support.tiny_lm import VOCAB, tiny_llama

Result = TypeVar("Result")

#: Draws for the property tests: a model's seed, and how many one-token calibration sequences.
SEEDS = st.integers(0, 2**31)
TOKEN_COUNTS = st.integers(2, 48)

#: The dtypes that must choose alike.
EXACT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
HIDDEN = 16
HEAD_DIM = 4  # 4 query heads, 2 key/value groups of 2
CONFIG = {
    "hidden_size": HIDDEN, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": HEAD_DIM,
    "hidden_act": "relu", "rms_norm_eps": 0.0,
}  # fmt: skip


def calibration_tokens(n_tokens: int, seed: int) -> torch.Tensor:
    """``[n_tokens, 1]`` token ids: one-token sequences, whose attention is exact."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n_tokens, 1), generator=generator)


def rich_llama(seed: int, *, intermediate: int = 24, scale: int = 2) -> nn.Module:
    """One decoder block with every projection drawn from small integers (``-scale..scale``)."""
    model = tiny_llama(seed, layers=1, intermediate_size=intermediate, **CONFIG)
    generator = torch.Generator().manual_seed(seed)
    block = model.model.layers[0]
    with torch.no_grad():
        _embed(model, generator)
        _norm_weights(block, generator)
        _attention(block.self_attn, generator, scale)
        for layer in (block.mlp.gate_proj, block.mlp.up_proj, block.mlp.down_proj):
            layer.weight.copy_(_ints(layer.weight.shape, scale, generator))
    return model


def flipping_llama(seed: int, *, layers: int = 4, intermediate: int = 24) -> nn.Module:
    """``layers`` blocks, each flipping the sign of some classes of tokens (a coordinate and a sign) exactly.

    Channel k reads one coordinate ``h`` with gate weight ``+-1`` (so it fires for one
    sign only) and up weight 1, and writes ``delta_k`` into coordinate ``h``: 0, or the
    value that takes ``+-e_h`` to ``-+e_h``. No two channels of a block share a class,
    so the stream stays one-hot with entries +-1. The attention's output projection is
    zero (every head scores 0: these models are for block and allocation choices).
    """
    model = tiny_llama(seed, layers=layers, intermediate_size=intermediate, **CONFIG)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        _embed(model, generator)
        for block in model.model.layers:
            _norm_weights(block, generator)
            _attention(block.self_attn, generator, 2)
            block.self_attn.o_proj.weight.zero_()
            classes = torch.randperm(2 * HIDDEN, generator=generator)[:intermediate]
            home, sign = classes % HIDDEN, 1.0 - 2.0 * (classes // HIDDEN)
            flips = torch.randint(0, 2, (intermediate,), generator=generator).float()
            mlp, norm = block.mlp, block.post_attention_layernorm.weight
            channels = torch.arange(intermediate)
            for layer in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                layer.weight.zero_()
            mlp.gate_proj.weight[channels, home] = sign
            mlp.up_proj.weight[channels, home] = 1.0
            # the channel makes 16 * w^2 * sign where its class is, so -1 / (8 w^2) writes -2 * sign: a flip
            mlp.down_proj.weight[home, channels] = -flips / (8 * norm[home].square())
    return model


def exact_mixtral(seed: int, *, experts: int = 4, per_token: int = 2) -> nn.Module:
    """One Mixtral block: routing softmax in float32 of exact logits, experts with small integer weights."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, intermediate_size=8, num_hidden_layers=1, max_position_embeddings=128,
        num_local_experts=experts, num_experts_per_tok=per_token, tie_word_embeddings=False, **CONFIG,
    )  # fmt: skip
    model = transformers.MixtralForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(seed)
    block = model.model.layers[0]
    with torch.no_grad():
        _embed(model, generator)
        _norm_weights(block, generator)
        _attention(block.self_attn, generator, 2)
        moe = block.mlp
        moe.gate.weight.copy_(_ints(moe.gate.weight.shape, 2, generator))
        for name, tensor in moe.experts.named_parameters():
            tensor.copy_(_ints(tensor.shape, 1, generator))  # an output sums at most 8 products of 8 x 8
            assert name in ("gate_up_proj", "down_proj"), name
    return model


def in_every_dtype(model: nn.Module, run: Callable[[nn.Module], Result]) -> tuple[list[nn.Module], list[Result]]:
    """``run`` on a copy of ``model`` in each of :data:`EXACT_DTYPES`, float32 first: the copies, and its results."""
    copies = [copy.deepcopy(model).to(dtype) for dtype in EXACT_DTYPES]
    return copies, [run(typed) for typed in copies]


def assert_same_tensors_in_every_dtype(models: list[nn.Module]) -> None:
    """Each model holds, name for name, the first (float32) model's tensors in its own dtype.

    The same units removed and the same weights pruned, and every value computed in
    float32 before it was written back in the model's dtype.
    """
    reference = models[0].state_dict()
    for model in models[1:]:
        state = model.state_dict()
        assert state.keys() == reference.keys()
        for name, tensor in state.items():
            assert torch.equal(tensor, reference[name].to(tensor.dtype)), name


def _ints(shape: torch.Size | tuple[int, ...], scale: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(-scale, scale + 1, tuple(shape), generator=generator).float()


def _embed(model: nn.Module, generator: torch.Generator) -> None:
    """Token t is ``+-e_(t mod 16)``, the sign drawn per token."""
    weight = model.get_input_embeddings().weight
    weight.zero_()
    signs = 1.0 - 2.0 * torch.randint(0, 2, (VOCAB,), generator=generator).float()
    weight[torch.arange(VOCAB), torch.arange(VOCAB) % HIDDEN] = signs


def _norm_weights(block: nn.Module, generator: torch.Generator) -> None:
    for norm in (block.input_layernorm, block.post_attention_layernorm):
        norm.weight.copy_(2.0 ** torch.randint(0, 2, norm.weight.shape, generator=generator).float())


def _attention(attention: nn.Module, generator: torch.Generator, scale: int) -> None:
    """Free q, k, v; an output projection whose two query heads per key/value group cancel exactly."""
    for layer in (attention.q_proj, attention.k_proj):
        layer.weight.copy_(_ints(layer.weight.shape, 1, generator))
    attention.v_proj.weight.copy_(_ints(attention.v_proj.weight.shape, scale, generator))
    groups = _ints((HIDDEN, 2 * HEAD_DIM), 1, generator).split(HEAD_DIM, dim=1)
    attention.o_proj.weight.copy_(torch.cat([groups[0], -groups[0], groups[1], -groups[1]], dim=1))
