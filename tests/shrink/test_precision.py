"""Half precision shrinks what float32 shrinks: statistics and scores in float32 whatever the model's dtype.

The models of :mod:`tests.support.exact_lm` make every activation a statistic reads
exact in float32, float16 and bfloat16, so each dtype must gather the same
statistics bit for bit and remove the same units. Equal scores keep the earlier
unit (and remove the earlier block), the same way in every dtype.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import prunereg
from prunereg._runtime.standard import ChannelMoments
from tests.support.exact_lm import (
    SEEDS,
    TOKEN_COUNTS,
    assert_same_tensors_in_every_dtype,
    calibration_tokens,
    exact_mixtral,
    flipping_llama,
    in_every_dtype,
    rich_llama,
)
from tests.support.statistics import folded

pytest.importorskip("transformers")

SETTINGS = settings(max_examples=10, deadline=None)


def _shrunk(model: nn.Module, method: str, tokens: torch.Tensor, **options: Any) -> list[nn.Module]:
    """``model`` shrunk in each of :data:`EXACT_DTYPES`, float32 first; every report's block scores alike."""
    shrunk, reports = in_every_dtype(
        model, lambda typed: prunereg.shrink(typed, method, tokens, progress=False, batch_size=16, **options)
    )
    for report in reports[1:]:
        assert [(b.score, b.kept) for b in report.blocks] == [(b.score, b.kept) for b in reports[0].blocks]
        assert report.removed_blocks == reports[0].removed_blocks
    return shrunk


@SETTINGS
@given(
    seed=SEEDS,
    method=st.sampled_from(["flap", "wanda_sp", "magnitude_sp"]),
    mlp=st.sampled_from([0.25, 0.5, 0.75]),
    heads=st.sampled_from([0.0, 0.5]),
    n_tokens=TOKEN_COUNTS,
    scale=st.integers(1, 2),
)
def test_every_channel_method_removes_the_same_mlp_channels_and_heads_in_every_dtype(
    seed: int, method: str, mlp: float, heads: float, n_tokens: int, scale: int
) -> None:
    model = rich_llama(seed, scale=scale)
    shrunk = _shrunk(model, method, calibration_tokens(n_tokens, seed), mlp=mlp, heads=heads)
    assert shrunk[0].config.intermediate_size < 24
    assert_same_tensors_in_every_dtype(shrunk)


@SETTINGS
@given(seed=SEEDS, layers=st.integers(1, 3), n_tokens=TOKEN_COUNTS)
def test_block_influence_removes_the_same_blocks_in_every_dtype(seed: int, layers: int, n_tokens: int) -> None:
    shrunk = _shrunk(flipping_llama(seed), "block_influence", calibration_tokens(n_tokens, seed), layers=layers)
    assert shrunk[0].config.num_hidden_layers == 4 - layers
    assert_same_tensors_in_every_dtype(shrunk)


@SETTINGS
@given(
    seed=SEEDS,
    experts=st.sampled_from([0.25, 0.5]),  # 0.75 would leave fewer experts than a token is routed to
    per_token=st.integers(1, 2),
    n_tokens=TOKEN_COUNTS,
)
def test_reap_removes_the_same_experts_in_every_dtype(seed: int, experts: float, per_token: int, n_tokens: int) -> None:
    model = exact_mixtral(seed, per_token=per_token)
    shrunk = _shrunk(model, "reap", calibration_tokens(n_tokens, seed), experts=experts)
    assert shrunk[0].config.num_local_experts < 4
    assert_same_tensors_in_every_dtype(shrunk)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_running_moments_of_half_precision_inputs_are_those_of_the_same_float32_values(dtype: torch.dtype) -> None:
    """In float32 whatever the input: 480 squared overflows float16, and bfloat16 sums would round."""
    batches = [_representable((n, 3, 6), seed) for seed, n in enumerate((1, 4, 2))]
    half = folded(ChannelMoments, [batch.to(dtype) for batch in batches]).result()
    single = folded(ChannelMoments, batches).result()
    for got, want in zip(vars(half).values(), vars(single).values(), strict=True):
        assert got == want if isinstance(want, int) else (got.dtype == torch.float32 and torch.equal(got, want))


def _representable(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Integers of 4 significant bits up to 480: exact in every dtype, their squares beyond float16's range."""
    generator = torch.Generator().manual_seed(seed)
    ints = torch.randint(-15, 16, shape, generator=generator).float()
    return ints * 2.0 ** torch.randint(0, 6, shape, generator=generator).float()
