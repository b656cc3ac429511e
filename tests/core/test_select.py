"""The shared selection routine: torch's masks where no two candidates tie, exactly k always."""

from __future__ import annotations

import itertools
import math
import threading

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import prunereg.prune as prune
from prunereg._selection import radix
from prunereg._selection import select as _select
from prunereg._selection.radix import Marker, find_threshold, order_keys
from prunereg._selection.select import clear_selected, prune_lowest, select_k, top_indices

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
CUTOFF = _select.TOPK_CUTOFF["cpu"]


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Radix select from 2 entries up and blocks of 7, so small inputs cross blocks and passes."""
    monkeypatch.setitem(_select.TOPK_CUTOFF, "cpu", 1)
    monkeypatch.setattr(_select, "BLOCK", 7)


def distinct(n: int, dtype: torch.dtype, *, seed: int = 0, signed: bool = True) -> torch.Tensor:
    """``n`` values of ``dtype`` with distinct magnitudes, in random order.

    16-bit floats have fewer than 32768 positive finite values: past that, some repeat.
    """
    g = torch.Generator().manual_seed(seed)
    if dtype in (torch.float16, torch.bfloat16):
        # Distinct positive bit patterns below inf are distinct values.
        top = 0x7C00 if dtype == torch.float16 else 0x7F80
        pool = torch.randperm(top - 1, generator=g)
        bits = pool[:n] if n < top else pool[torch.randint(0, top - 1, (n,), generator=g)]
        values = bits.add(1).to(torch.int16).view(dtype)
    else:
        values = (torch.randperm(n, generator=g).to(dtype) + 1) / (n + 1)
    if signed:
        values *= torch.randint(0, 2, (n,), generator=g).to(dtype) * 2 - 1
    return values


def torch_mask(scores: torch.Tensor, k: int, largest: bool) -> torch.Tensor:
    """torch's selection: ``topk``, with prunereg's documented NaN policy (NaN lowest)."""
    flat = (
        scores.reshape(-1).nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
        if scores.is_floating_point()
        else scores.reshape(-1)
    )
    mask = torch.zeros(flat.shape, dtype=torch.bool)
    mask[torch.topk(flat, k, largest=largest).indices] = True
    return mask.view(scores.shape)


def tied_at_threshold(scores: torch.Tensor, k: int, largest: bool) -> bool:
    """Whether the k-th and (k+1)-th candidates (NaN lowest) are equal: then torch's choice is arbitrary."""
    flat = scores.reshape(-1).double().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    if k in (0, flat.numel()):
        return False
    ordered = flat.sort(descending=largest).values
    return bool(ordered[k - 1] == ordered[k])


def selection_order(scores: torch.Tensor, largest: bool) -> list[int]:
    """Indices in the order the documented rule selects them: by value (NaN lowest), ties by index."""
    flat = scores.reshape(-1)
    if flat.is_floating_point():
        flat = flat.double()
        nan = flat.isnan().tolist()
        values = flat.nan_to_num(nan=0.0, posinf=float("inf"), neginf=float("-inf")).tolist()
    else:  # exact Python ints: doubles would merge neighbours of int64
        nan, values = [False] * flat.numel(), flat.tolist()
    sign = -1 if largest else 1
    return sorted(range(len(values)), key=lambda i: ((1 - nan[i]) * sign, values[i] * sign, i))


def assert_rule(scores: torch.Tensor, mask: torch.Tensor, k: int, largest: bool) -> None:
    want = torch.zeros(scores.numel(), dtype=torch.bool)
    want[selection_order(scores, largest)[:k]] = True
    assert torch.equal(mask.reshape(-1), want)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    dtype=st.sampled_from(FLOATS),
    n=st.sampled_from([1, 2, 13, CUTOFF - 1, CUTOFF, CUTOFF + 1, 3 * CUTOFF + 5]),
    fraction=st.floats(0, 1),
    largest=st.booleans(),
    specials=st.lists(st.sampled_from([float("nan"), float("inf"), float("-inf"), 0.0, -0.0]), max_size=4),
    seed=st.integers(0, 1000),
)
def test_masks_equal_torch_topk_without_ties(dtype, n, fraction, largest, specials, seed):
    scores = distinct(n, dtype, seed=seed)
    specials = specials[:n]
    scores[: len(specials)] = torch.tensor(specials, dtype=dtype)
    k = round(fraction * n)
    assume(not tied_at_threshold(scores, k, largest))
    (mask,) = select_k([scores], k, largest=largest)
    assert mask.dtype == torch.bool and mask.shape == scores.shape
    assert torch.equal(mask, torch_mask(scores, k, largest))


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    n=st.sampled_from([CUTOFF + 1, 2 * CUTOFF]),
    amount=st.floats(0, 1),
    seed=st.integers(0, 1000),
)
def test_l1_unstructured_is_torchs_across_the_cutoff(dtype, n, amount, seed):
    weights = distinct(n, dtype, seed=seed).view(-1, 1) if n % 2 else distinct(n, dtype, seed=seed).view(2, -1)
    ones = torch.ones_like(weights)
    assume(not tied_at_threshold(weights.abs(), round(amount * n), False))
    mine = prune.L1Unstructured(amount).compute_mask(weights, ones)
    theirs = torch_prune.L1Unstructured(amount).compute_mask(weights, ones)
    assert torch.equal(mine, theirs)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [CUTOFF, 4 * CUTOFF])
def test_random_unstructured_is_torchs_with_the_same_seed(dtype, n):
    t = torch.zeros(n, dtype=dtype)
    amount = 0.4
    torch.manual_seed(7)
    draws = torch.rand_like(t)
    torch.manual_seed(7)
    mine = prune.RandomUnstructured(amount).compute_mask(t, torch.ones_like(t))
    after_mine = torch.get_rng_state()
    torch.manual_seed(7)
    theirs = torch_prune.RandomUnstructured(amount).compute_mask(t, torch.ones_like(t))
    assert torch.equal(after_mine, torch.get_rng_state())
    k = round(amount * n)
    assert int((mine == 0).sum()) == k
    if n <= CUTOFF or not tied_at_threshold(draws, k, True):  # topk decides small inputs, ties included
        assert torch.equal(mine, theirs)
    else:  # 16-bit draws tie often: past the cutoff only the documented rule is promised
        assert_rule(draws, mine == 0, k, True)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    dtype=st.sampled_from([*FLOATS, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]),
    n=st.integers(1, 60),
    distinct_values=st.integers(1, 4),
    fraction=st.floats(0, 1),
    largest=st.booleans(),
    cuts=st.lists(st.integers(0, 60), max_size=3),
    seed=st.integers(0, 1000),
)
def test_exactly_k_under_heavy_ties(small_blocks, dtype, n, distinct_values, fraction, largest, cuts, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, distinct_values, (n,), generator=g).to(dtype)
    if dtype.is_floating_point:
        scores[torch.rand(n, generator=g) < 0.2] = float("nan")
    k = round(fraction * n)
    bounds = [0, *sorted(min(c, n) for c in cuts), n]
    chunks = [scores[a:b] for a, b in itertools.pairwise(bounds)]
    masks = select_k(chunks, k, largest=largest)
    mask = torch.cat([m.reshape(-1) for m in masks])
    assert int(mask.sum()) == k
    assert_rule(scores, mask, k, largest)
    assert all(torch.equal(a, b) for a, b in zip(masks, select_k(chunks, k, largest=largest)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
@pytest.mark.parametrize("largest", [False, True])
def test_extreme_keys_in_every_radix_pass(small_blocks, dtype, largest):
    """The lowest and highest keys of a width must not be confused when digits are narrowed."""
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        values = [
            float("nan"),
            float("-inf"),
            -info.max,
            -1.0,
            -info.tiny,
            -0.0,
            0.0,
            info.tiny,
            1.0,
            info.max,
            float("inf"),
        ]
        values += [info.max * 0.5, -info.max * 0.5, info.tiny * 3]
    else:
        info = torch.iinfo(dtype)
        values = [info.min, info.min + 1, -65536, -65535, -1, 0, 1, 65535, 65536, info.max - 1, info.max]
    scores = torch.tensor(values, dtype=dtype)[torch.randperm(len(values), generator=torch.Generator().manual_seed(0))]
    for k in range(len(values) + 1):
        (mask,) = select_k([scores], k, largest=largest)
        assert_rule(scores, mask, k, largest)


def test_magnitude_ranks_absolute_values(small_blocks):
    scores = torch.tensor([-5.0, 1.0, float("nan"), -0.5, 3.0, -float("inf")])
    for k in range(7):
        (mask,) = select_k([scores], k, magnitude=True)
        assert_rule(scores.abs(), mask, k, False)


def test_chunks_of_different_dtypes_compare_in_the_promoted_dtype(small_blocks):
    a = torch.tensor([0.5, 0.25, 3.0], dtype=torch.bfloat16)
    b = torch.tensor([0.3, 0.26, 2.0], dtype=torch.float32)
    masks = select_k([a, b], 3)
    assert [m.tolist() for m in masks] == [[False, True, False], [True, True, False]]


def test_order_keys_follow_the_values():
    values = torch.tensor([float("nan"), float("-inf"), -2.0, -0.0, 0.0, 1e-40, 3.0, float("inf")])
    keys = order_keys(values)
    assert keys[0] == torch.iinfo(torch.int32).min
    assert keys[3] == keys[4] == 0
    steps = (keys[1:].long() - keys[:-1].long()).sign().tolist()
    assert steps == [1, 1, 1, 0, 1, 1, 1]
    positive = torch.tensor([0.0, 1.0, 2.0])
    assert order_keys(positive).data_ptr() == positive.data_ptr()  # non-negative floats: a view


def test_top_indices_small_and_large_agree_with_topk(small_blocks):
    scores = distinct(50, torch.float32)
    want = set(torch.topk(scores, 20, largest=True).indices.tolist())
    assert set(top_indices(scores, 20, largest=True).tolist()) == want


def test_meta_chunks_give_meta_masks():
    masks = select_k([torch.empty(3, 4, device="meta"), torch.empty(5, device="meta")], 6)
    assert [(m.device.type, m.dtype, tuple(m.shape)) for m in masks] == [
        ("meta", torch.bool, (3, 4)),
        ("meta", torch.bool, (5,)),
    ]


@pytest.mark.parametrize("magnitude", [False, True])
@pytest.mark.parametrize("largest", [False, True])
def test_prune_lowest_may_write_the_mask_over_its_scores(small_blocks, largest, magnitude):
    scores = distinct(50, torch.float32, seed=4)
    default = (torch.rand(50, generator=torch.Generator().manual_seed(1)) > 0.2).float()
    (selected,) = select_k([scores], 20, largest=largest, magnitude=magnitude)
    want = clear_selected(default, selected)
    got = prune_lowest(scores, 20, default, largest=largest, magnitude=magnitude, out=scores)
    assert got.data_ptr() == scores.data_ptr() and torch.equal(got, want)


def test_bad_k_is_a_value_error():
    with pytest.raises(ValueError, match="k=4"):
        select_k([torch.zeros(3)], 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.int64])
def test_clear_selected_is_clone_then_zero(dtype):
    default = torch.tensor([1, 0, 1, 1, 1, 1, 0]).to(dtype)
    if dtype.is_floating_point:
        default[4:6] = torch.tensor([0.5, float("inf")], dtype=dtype)
    selected = torch.tensor([True, True, False, False, True, True, False])
    for d, s in [
        (default, selected),
        (default[:4], selected[:4]),
        (torch.ones(2, 3, dtype=dtype).t(), selected[:6].view(3, 2)),
    ]:
        want = d.clone()
        want[s] = 0
        got = clear_selected(d, s)
        assert torch.equal(got, want) and got.is_contiguous()


def run_ranks(shards, k, largest, two_pass, block=3):
    """Run the search on every shard in its own thread, with collectives over the threads."""
    barrier = threading.Barrier(len(shards))
    slots: list = [None] * len(shards)

    def collective(rank, tensor, combine):
        slots[rank] = tensor.clone()
        barrier.wait()
        result = combine(rank)
        barrier.wait()
        return result

    results: list = [None] * len(shards)

    def work(rank):
        keys = order_keys(shards[rank])
        collectives = {
            "all_reduce": lambda t: collective(rank, t, lambda r: sum(slots)),
            "exclusive_prefix": lambda t: collective(rank, t, lambda r: sum(slots[:r], torch.zeros_like(t))),
        }
        threshold = find_threshold(
            lambda: iter(keys.split(block)),
            k,
            width=radix.key_width(shards[rank].dtype),
            largest=largest,
            two_pass=two_pass,
            **collectives,
        )
        mark = Marker(threshold, **collectives)
        blocks = [mark(b) for b in keys.split(block)]
        for number, positions in mark.finish():
            blocks[number][positions] = True
        results[rank] = torch.cat(blocks) if blocks else torch.zeros(0, dtype=torch.bool)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(len(shards))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.parametrize("two_pass", [False, True])
@pytest.mark.parametrize("largest", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_sharded_search_selects_what_the_whole_would(small_blocks, two_pass, largest, dtype):
    g = torch.Generator().manual_seed(3)
    # 20 first-digit bins of about 4 entries (small enough to be collected in two passes),
    # each with 4 values differing in their low bits, so that ties straddle shards.
    bins, low = torch.randint(0, 20, (80,), generator=g), torch.randint(0, 4, (80,), generator=g)
    scores = (2.0 ** bins.double() * (1 + low.double() / 1024)).to(dtype)
    shards = [scores[:13], scores[13:14], scores[14:14], scores[14:]]
    for k in [1, 7, 20, 40, 80]:
        masks = run_ranks(shards, k, largest, two_pass)
        (whole,) = select_k([scores], k, largest=largest)
        assert torch.equal(torch.cat(masks), whole)


def test_counts_beyond_int32_are_exact():
    """2**31 entries and more: 3000 processes of 2**20 keys each, simulated by scaling the counts."""
    keys = order_keys(torch.arange(1 << 20, dtype=torch.float32))
    ranks, k = 3000, 1_500_000_001
    threshold = find_threshold(
        lambda: iter(keys.split(1 << 18)),
        k,
        width=32,
        all_reduce=lambda c: c * ranks,
        exclusive_prefix=lambda t: t * 1234,
    )
    # Each value occurs 3000 times: k falls on value 500000 (after 500000 * 3000 smaller entries).
    assert threshold.key == int(order_keys(torch.tensor([500000.0]))[0])
    assert (threshold.before, threshold.take, threshold.ties, threshold.offset) == (1_500_000_000, 1, 3000, 1234)


# The small path (topk without sorting, one NaN check, zeros written into a copy of the mask) -----------------

SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from([*FLOATS, torch.int32]),
    shape=st.sampled_from([(1,), (7,), (3, 5), (64, 64), (CUTOFF,)]),
    distinct_values=st.integers(1, 9),
    specials=st.lists(st.sampled_from(SPECIAL), max_size=6),
    fraction=st.floats(0, 1),
    largest=st.booleans(),
    magnitude=st.booleans(),
    default_kind=st.sampled_from(["ones", "binary", "bool", "scaled"]),
    seed=st.integers(0, 1000),
)
def test_small_prune_lowest_is_the_mask_of_the_selection_ties_and_nan_included(
    dtype, shape, distinct_values, specials, fraction, largest, magnitude, default_kind, seed
):
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    scores = (torch.randint(-distinct_values, distinct_values + 1, shape, generator=g)).to(torch.float64)
    if dtype.is_floating_point:
        flat = scores.view(-1)
        flat[torch.randint(0, n, (len(specials),), generator=g)] = torch.tensor(specials, dtype=torch.float64)
    scores = scores.to(dtype)
    keep = torch.rand(shape, generator=g) > 0.3
    default = {
        "ones": torch.ones(shape),
        "binary": keep.float(),
        "bool": keep,
        "scaled": torch.tensor([0.0, 0.5, -2.0, float("inf"), float("nan")])[torch.randint(0, 5, shape, generator=g)],
    }[default_kind]
    k = round(fraction * n)
    (selected,) = select_k([scores], k, largest=largest, magnitude=magnitude)
    got = prune_lowest(scores, k, default, largest=largest, magnitude=magnitude)
    want = default.clone()
    want[selected] = 0  # clear_selected's definition
    assert got.dtype == default.dtype and got.shape == default.shape and got.is_contiguous()
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)) and int(selected.sum()) == k  # NaN where NaN was


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 200),
    distinct_values=st.integers(1, 5),
    fraction=st.floats(0, 1),
    largest=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_top_indices_choose_the_entries_sorted_topk_chooses_under_ties(n, distinct_values, fraction, largest, seed):
    scores = torch.randint(0, distinct_values, (n,), generator=torch.Generator().manual_seed(seed)).float()
    k = round(fraction * n)
    want = set(torch.topk(scores, k, largest=largest).indices.tolist())  # torch.nn.utils.prune's call
    assert set(top_indices(scores, k, largest=largest).tolist()) == want


def test_opposite_infinities_without_nan_rank_as_the_numbers_they_are():
    scores = torch.tensor([float("inf"), 1.0, float("-inf"), 2.0])  # their sum is NaN; no entry is
    assert _select.nan_lowest(scores) is scores
    assert _select.nan_lowest(torch.tensor([float("inf"), float("nan")])).dtype != torch.float32
    (mask,) = select_k([scores], 2)
    assert mask.tolist() == [False, True, True, False]
