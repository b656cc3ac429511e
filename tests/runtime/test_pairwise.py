"""Statistics combined along one fixed tree over the batches: any contiguous split (ranks) gives the same bits."""

from __future__ import annotations

import itertools
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunereg._runtime.pairwise import PairwiseTree
from prunereg._runtime.recorder import Tally
from prunereg._runtime.standard import BlockCosine, ChannelMoments, Hessian, InputSqNorms
from prunereg.toolkit import Observation

LAYER_INPUT = {"input_sq_norms": InputSqNorms, "hessian": Hessian, "channel_moments": ChannelMoments}
BLOCK = {"block_cosine": BlockCosine}


def _batches(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches of inputs and outputs whose scales differ by orders of magnitude (so sums depend on order)."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        scale = 10.0 ** torch.randint(-3, 4, (1,), generator=generator).item()
        tokens = int(torch.randint(1, 5, (1,), generator=generator))
        x = torch.randn(2, tokens, 6, generator=generator) * scale
        batches.append((x, x + torch.randn(2, tokens, 6, generator=generator)))
    return batches


def _tally(batches: list[tuple[torch.Tensor, torch.Tensor]], first: int, factories: dict) -> Tally:
    tally = Tally(factories)
    for index, (x, y) in enumerate(batches, start=first):
        tally.fold(Observation(index, x, y))
    return tally


def _assert_same_bits(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        mine, theirs = a[name], b[name]
        if isinstance(mine, torch.Tensor):
            assert torch.equal(mine, theirs), name
        elif hasattr(mine, "__dataclass_fields__"):
            for field in mine.__dataclass_fields__:
                left, right = getattr(mine, field), getattr(theirs, field)
                assert torch.equal(left, right) if isinstance(left, torch.Tensor) else left == right, (name, field)
        else:
            assert mine == theirs, name


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 13),
    cuts=st.lists(st.floats(0, 1), min_size=0, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_any_contiguous_split_combined_in_order_gives_the_bits_of_one_tally(n, cuts, seed):
    batches = _batches(n, seed)
    bounds = [0, *sorted(int(c * n) for c in cuts), n]  # ranks' ranges, some perhaps empty
    for factories in (LAYER_INPUT, BLOCK):
        alone = _tally(batches, 0, factories)
        ranks = [_tally(batches[a:b], a, factories) for a, b in itertools.pairwise(bounds)]
        combined = Tally(factories)
        for rank in ranks:
            combined.combine(rank)
        assert combined.n_tokens == alone.n_tokens
        _assert_same_bits(combined.results(), alone.results())


def test_a_tree_holds_a_logarithmic_number_of_partials():
    class Count:
        def __init__(self, n: int) -> None:
            self.n = n

        def combine(self, other: Count) -> None:
            self.n += other.n

    tree: PairwiseTree[Count] = PairwiseTree()
    for batch in range(100):
        tree.add(batch, Count(1))
        assert len(tree.spans) == bin(batch + 1).count("1") <= math.floor(math.log2(batch + 1)) + 1
    total = tree.total()
    assert total is not None and total.n == 100


def test_every_statistic_of_a_batch_folds_into_that_batchs_own_partial():
    x = torch.ones(1, 2, 3)
    tally = Tally({"input_sq_norms": InputSqNorms})
    for batch in (0, 0, 1):  # a layer called twice in batch 0
        tally.fold(Observation(batch, x))
    spans = tally.spans()
    assert [(s.level, s.index, s.value.n_tokens) for s in spans] == [(1, 0, 6)]
    assert tally.results()["input_sq_norms"].tolist() == [6.0, 6.0, 6.0]
