"""The built-in statistics: the explicit formulas, in float32 whatever the input, and combined exactly across batches.

``combine`` is what issue 34's ranks will all-reduce: a statistic gathered over
two halves of the batches and combined must equal (to float rounding) the one
gathered over all of them, in a fixed order, leaving the other half unchanged.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunereg._runtime.gram import GRAM_TILE
from prunereg._runtime.standard import BlockCosine, ChannelMoments, ExpertRouting, Hessian, InputSqNorms
from prunereg.toolkit import Observation, Statistic
from tests.support.statistics import folded

SHAPES = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 5)), min_size=1, max_size=4)


def _inputs(shapes: list[tuple[int, int]], width: int, dtype: torch.dtype, offset: float = 0.0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(len(shapes) * 7 + width)
    return [(torch.randn(b, t, width, generator=generator) + offset).to(dtype) for b, t in shapes]


def _tokens(batches: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([x.reshape(-1, x.shape[-1]) for x in batches]).double()


@settings(max_examples=25, deadline=None)
@given(shapes=SHAPES, width=st.integers(1, 6), dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
def test_input_statistics_equal_the_formulas_over_all_tokens(shapes, width, dtype):
    batches = _inputs(shapes, width, dtype)
    tokens = _tokens(batches)
    n = tokens.shape[0]
    sq_norms, hessian = folded(InputSqNorms, batches).result(), folded(Hessian, batches).result()
    assert sq_norms.dtype == hessian.dtype == torch.float32
    assert torch.allclose(sq_norms.double(), (tokens**2).sum(0), rtol=1e-5, atol=1e-5)
    assert torch.allclose(hessian.double(), 2 / n * tokens.T @ tokens, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("width", [GRAM_TILE - 1, GRAM_TILE, GRAM_TILE + 1, 2 * GRAM_TILE + 88])
def test_a_hessian_wider_than_a_tile_is_summed_by_upper_tiles_and_comes_out_symmetric(width):
    torch.manual_seed(0)
    batches = [torch.randn(3, 40, width), torch.randn(1, 17, width)]
    running = folded(Hessian, batches)
    hessian = running.result()
    tokens = _tokens(batches)
    assert torch.equal(hessian, hessian.T)
    assert torch.allclose(hessian.double(), 2 / tokens.shape[0] * tokens.T @ tokens, rtol=1e-5, atol=1e-5)
    assert torch.equal(running.result(), hessian)  # asking twice gives the same matrix


def test_the_hessian_is_summed_in_full_float32_even_inside_faster_forwards():
    torch.manual_seed(0)
    x = torch.randn(512, 256)
    exact = folded(Hessian, [x])
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        inside = folded(Hessian, [x])
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.equal(inside.result(), exact.result())


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=6),
    offset=st.floats(min_value=-100, max_value=100),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_moments_merged_over_any_batches_equal_those_of_all_tokens_at_once(sizes, offset, seed):
    generator = torch.Generator().manual_seed(seed)
    batches = [torch.randn(size, 5, generator=generator, dtype=torch.float64) + offset for size in sizes]
    # [tokens, channels] or [batch, seq, channels]: every leading index a token
    moments = folded(ChannelMoments, [b.float().unsqueeze(0) if i % 2 else b.float() for i, b in enumerate(batches)])
    tokens = torch.cat(batches)
    result = moments.result()
    assert result.n_tokens == tokens.shape[0]
    torch.testing.assert_close(result.mean.double(), tokens.mean(0), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(result.sq_norms.double(), tokens.square().sum(0), rtol=1e-5, atol=1e-3)
    if tokens.shape[0] > 1:
        torch.testing.assert_close(result.variance.double(), tokens.var(0), rtol=1e-3, atol=1e-4)


def test_no_tokens_give_no_moments():
    assert folded(ChannelMoments, [torch.empty(0, 4)]).result() is None


def _observations(statistic: type[Statistic], batches: list[torch.Tensor]) -> list[Observation]:
    """What ``statistic`` observes of each batch: a layer's input, or a block's input and output."""
    if statistic.SITE == "block":
        return [Observation(i, x, torch.tanh(x) + 0.3 * x.roll(1, dims=-1)) for i, x in enumerate(batches)]
    return [Observation(i, x) for i, x in enumerate(batches)]


def _gathered(statistic: type[Statistic], observations: list[Observation]) -> Statistic:
    made = statistic()
    for observation in observations:
        made.fold(observation)
    return made


def _values(statistic: Statistic) -> list[torch.Tensor]:
    """A result as tensors in float64, to compare."""
    result = statistic.result()
    if isinstance(result, float):
        return [torch.tensor(result, dtype=torch.float64)]
    if isinstance(result, torch.Tensor):
        return [result.double()]
    return [torch.as_tensor(value).double() for value in vars(result).values()]


@settings(max_examples=30, deadline=None)
@given(
    statistic=st.sampled_from([InputSqNorms, Hessian, ChannelMoments, BlockCosine]),
    shapes=SHAPES.filter(lambda shapes: len(shapes) > 1),
    width=st.integers(1, 6),
    offset=st.floats(-50, 50),
    data=st.data(),
)
def test_statistics_combined_over_two_halves_equal_those_of_all_batches(statistic, shapes, width, offset, data):
    observations = _observations(statistic, _inputs(shapes, width, torch.float32, offset))
    cut = data.draw(st.integers(1, len(observations) - 1))
    whole = _gathered(statistic, observations)
    first, second = _gathered(statistic, observations[:cut]), _gathered(statistic, observations[cut:])
    kept = copy.deepcopy(second)
    first.combine(second)
    for got, want in zip(_values(first), _values(whole), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3 * (1 + abs(offset)) ** 2)
    for got, want in zip(_values(second), _values(kept), strict=True):
        assert torch.equal(got, want)  # the other half is left as it was
    again = _gathered(statistic, observations[:cut])
    again.combine(_gathered(statistic, observations[cut:]))
    assert all(torch.equal(a, b) for a, b in zip(_values(again), _values(first), strict=True))  # a fixed order


@pytest.mark.parametrize("statistic", [InputSqNorms, Hessian, ChannelMoments, BlockCosine, ExpertRouting])
def test_a_statistic_combined_into_an_empty_one_is_copied_and_an_empty_one_changes_nothing(statistic):
    batches = _inputs([(2, 3), (1, 4)], 4, torch.float32)
    if statistic is ExpertRouting:
        gathered = _routing_over(batches)
    else:
        gathered = _gathered(statistic, _observations(statistic, batches))
    empty = statistic()
    empty.combine(gathered)
    assert all(torch.equal(a, b) for a, b in zip(_values(empty), _values(gathered), strict=True))
    before = _values(gathered)
    gathered.combine(statistic())
    assert all(torch.equal(a, b) for a, b in zip(_values(gathered), before, strict=True))


def _parts_in_order(statistic: type[Statistic], parts: list[list[Observation]]) -> Statistic:
    """Each part gathered on its own (a rank's batches), then combined into the first one in order."""
    combined = _gathered(statistic, parts[0])
    for part in parts[1:]:
        combined.combine(_gathered(statistic, part))
    return combined


@settings(max_examples=30, deadline=None)
@given(
    statistic=st.sampled_from([InputSqNorms, BlockCosine]),
    shapes=SHAPES,
    width=st.integers(1, 6),
    cuts=st.lists(st.integers(0, 4), max_size=3),
    seed=st.integers(0, 2**16),
)
def test_sums_combined_over_any_parts_equal_the_whole_bit_for_bit_where_the_sums_are_exact(
    statistic, shapes, width, cuts, seed
):
    """Small integers sum exactly in float32 (and their cosines' sums, rounded to float32, in float64): no drift."""
    generator = torch.Generator().manual_seed(seed)
    batches = [torch.randint(-8, 9, (b, t, width), generator=generator).float() for b, t in shapes]
    observations = _observations(statistic, batches)
    if statistic is BlockCosine:  # cosines that are float32 values sum exactly in float64 over this few tokens
        observations = [Observation(o.batch, o.inputs, o.inputs * 2) for o in observations]
    bounds = sorted({min(cut, len(observations)) for cut in cuts} | {0, len(observations)})
    parts = [observations[a:b] for a, b in itertools.pairwise(bounds)]
    combined, whole = _parts_in_order(statistic, parts), _gathered(statistic, observations)
    assert all(torch.equal(a, b) for a, b in zip(_values(combined), _values(whole), strict=True))


def test_moments_and_the_hessian_combine_with_their_counts_not_as_a_mean_of_means():
    """One token at 0 and nine at 10: the mean is 9 (a mean of means would say 5), the variance that of all ten."""
    few, many = torch.zeros(1, 2), torch.full((9, 2), 10.0)
    moments = _parts_in_order(ChannelMoments, [[Observation(0, few)], [Observation(1, many)]]).result()
    everything = torch.cat([few, many]).double()
    assert moments.n_tokens == 10
    assert torch.equal(moments.mean, torch.full((2,), 9.0))
    torch.testing.assert_close(moments.variance.double(), everything.var(0), rtol=1e-6, atol=0)
    assert torch.equal(moments.sq_norms, torch.full((2,), 900.0))
    hessian = _parts_in_order(Hessian, [[Observation(0, few)], [Observation(1, many)]]).result()
    torch.testing.assert_close(hessian.double(), 2 / 10 * everything.T @ everything, rtol=1e-6, atol=0)


def test_a_statistic_combines_with_its_own_kind_only():
    with pytest.raises(TypeError, match="Hessian combines with another Hessian, not InputSqNorms"):
        Hessian().combine(InputSqNorms())


class _Experts(torch.nn.Module):
    """Expert e multiplies its tokens by e + 1; the routing weight scales the output."""

    def forward(self, hidden, top_k_index, top_k_weights):
        scale = (top_k_index.float() + 1) * top_k_weights
        return hidden * scale.sum(-1, keepdim=True)


def _routing_over(batches: list[torch.Tensor]) -> ExpertRouting:
    routing = ExpertRouting()
    experts = _Experts()
    for index, hidden in enumerate(batches):
        rows = hidden.reshape(-1, hidden.shape[-1])
        chosen = (torch.arange(rows.shape[0]) % 3).unsqueeze(-1)
        weights = torch.full((rows.shape[0], 1), 0.5)
        output = experts(rows, chosen, weights)
        routing.fold(Observation(index, rows, output, module=experts, args=(rows, chosen, weights), units=4))
    return routing


def test_expert_routing_counts_each_experts_tokens_and_the_norms_of_its_outputs_at_weight_one():
    batches = _inputs([(2, 3), (1, 4)], 4, torch.float32)
    result = _routing_over(batches).result()
    rows = torch.cat([x.reshape(-1, 4) for x in batches])
    chosen = torch.cat([torch.arange(x.reshape(-1, 4).shape[0]) % 3 for x in batches])
    for expert in range(4):
        mine = rows[chosen == expert]
        norms = (mine * (expert + 1)).norm(dim=-1)
        assert result.routed[expert] == mine.shape[0]
        torch.testing.assert_close(result.gate_sum[expert], torch.tensor(0.5 * mine.shape[0]))
        torch.testing.assert_close(result.output_norm_sum[expert], norms.sum())
        torch.testing.assert_close(result.weighted_norm_sum[expert], 0.5 * norms.sum())
