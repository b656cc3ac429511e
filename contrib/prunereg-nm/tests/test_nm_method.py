"""NMSparsity: the N:M pattern, its ranking, its place in a PruningContainer, its errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from prunereg_nm import NMSparsity
from torch import nn

import prunereg
from prunereg.testing import check_pruning_method


def reference_mask(t: torch.Tensor, n: int, m: int, dim: int) -> torch.Tensor:
    """The N:M mask computed group by group in plain Python: largest |t| kept, ties to the earlier index."""
    moved = t.movedim(dim, -1)
    groups = moved.reshape(-1, m).abs().tolist()
    mask = torch.zeros(len(groups), m)
    for row, group in enumerate(groups):
        mask[row, sorted(range(m), key=lambda i: (-group[i], i))[:n]] = 1
    return mask.reshape(moved.shape).movedim(-1, dim)


def kept_per_group(mask: torch.Tensor, m: int, dim: int = -1) -> torch.Tensor:
    moved = mask.movedim(dim, -1)
    return (moved.reshape(-1, m) != 0).sum(-1)


def test_two_of_four_by_hand() -> None:
    t = torch.tensor([[0.1, -0.9, 0.5, 0.2, 3.0, 2.0, -1.0, 0.0]])
    mask = NMSparsity(2, 4).compute_mask(t, torch.ones_like(t))
    assert mask.tolist() == [[0, 1, 1, 0, 1, 1, 0, 0]]


def test_ties_keep_the_earlier_entry_and_nan_is_pruned_first() -> None:
    t = torch.tensor([[1.0, 1.0, 1.0, 1.0, float("nan"), 5.0, 0.0, -0.0]])
    mask = NMSparsity(2, 4).compute_mask(t, torch.ones_like(t))
    assert mask.tolist() == [[1, 1, 0, 0, 0, 1, 1, 0]]


@settings(max_examples=60, deadline=None)
@given(
    n_m=st.sampled_from([(1, 2), (2, 4), (4, 8), (3, 4), (1, 4), (5, 7)]),
    groups=st.integers(1, 3),
    rows=st.integers(1, 3),
    extra=st.integers(1, 2),
    dim=st.sampled_from([-1, 0, 1, -2]),
    ties=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matches_the_group_by_group_reference(n_m, groups, rows, extra, dim, ties, seed) -> None:
    n, m = n_m
    shape = [rows, extra, 3]
    shape[dim] = groups * m
    generator = torch.Generator().manual_seed(seed)
    t = torch.randint(-2, 3, shape, generator=generator).float() if ties else torch.randn(shape, generator=generator)
    mask = NMSparsity(n, m, dim).compute_mask(t, torch.ones_like(t))
    assert torch.equal(mask, reference_mask(t, n, m, dim))
    assert bool((kept_per_group(mask, m, dim) == n).all())


@pytest.mark.parametrize(
    ("kwargs", "shape"),
    [
        ({}, (8, 12)),
        ({"n": 1, "m": 4}, (8, 12)),
        ({"n": 3, "m": 4, "dim": 0}, (8, 12)),
        ({"n": 1, "m": 2, "dim": 1}, (3, 4, 2, 2)),
    ],
)
def test_follows_the_prunereg_contract(kwargs: dict, shape: tuple[int, ...]) -> None:
    check_pruning_method("nm_sparsity", tensor_shape=shape, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_every_dtype_gets_the_pattern(dtype: torch.dtype) -> None:
    t = torch.randn(4, 16, dtype=dtype)
    mask = NMSparsity(2, 4).compute_mask(t, torch.ones_like(t))
    assert torch.equal(mask.float(), reference_mask(t.float(), 2, 4, -1))


def test_importance_scores_decide_instead_of_the_weights() -> None:
    linear = nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[4.0, 3.0, 2.0, 1.0]]))
    scores = torch.tensor([[1.0, 2.0, 3.0, -4.0]])
    NMSparsity.apply(linear, "weight", n=2, m=4, importance_scores=scores)
    assert linear.weight_mask.tolist() == [[0, 0, 1, 1]]
    assert linear.weight.tolist() == [[0, 0, 2, 1]]


def test_conv_weight_grouped_along_input_channels() -> None:
    conv = nn.Conv2d(8, 3, kernel_size=2)
    NMSparsity.apply(conv, "weight", n=1, m=2, dim=1)
    assert torch.equal(conv.weight_mask, reference_mask(conv.weight_orig.detach(), 1, 2, 1))
    assert bool((kept_per_group(conv.weight_mask, 2, dim=1) == 1).all())


def test_after_earlier_pruning_groups_stay_aligned_and_survivors_are_kept() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(16, 8)
    prunereg.get("l1_unstructured").apply(linear, "weight", amount=0.4)
    before = linear.weight_mask.clone()
    NMSparsity.apply(linear, "weight", n=2, m=4)
    mask = linear.weight_mask
    assert isinstance(linear._forward_pre_hooks[next(iter(linear._forward_pre_hooks))], prunereg.PruningContainer)
    assert bool((mask <= before).all())
    survivors = kept_per_group(before, 4)
    assert torch.equal(kept_per_group(mask, 4), survivors.clamp(max=2))
    # Among each group's survivors, the two largest remain.
    weight = linear.weight_orig.detach() * before
    assert torch.equal(mask, reference_mask(weight, 2, 4, -1) * before)


def test_an_unstructured_kind_would_misalign_groups_in_a_container() -> None:
    """Why PRUNING_TYPE is "global": a container hands "unstructured" methods the flat survivors."""

    class FlatNM(NMSparsity):
        PRUNING_TYPE = "unstructured"

    torch.manual_seed(0)
    first = torch.ones(8, 16)
    first[:, 1] = 0  # 15 survivors a row: the flat survivors are no longer in the tensor's groups
    masks = []
    for method in (FlatNM, NMSparsity):
        linear = nn.Linear(16, 8)
        prunereg.get("custom_from_mask").apply(linear, "weight", mask=first)
        method.apply(linear, "weight", n=2, m=4)
        masks.append(linear.weight_mask)
    flat, grouped = masks
    assert bool((kept_per_group(flat, 4) > 2).any())
    assert bool((kept_per_group(grouped, 4) == 2).all())
    assert bool((grouped <= first).all())


def test_later_pruning_keeps_the_pattern() -> None:
    torch.manual_seed(1)
    linear = nn.Linear(8, 6)
    NMSparsity.apply(linear, "weight", n=2, m=4)
    prunereg.get("l1_unstructured").apply(linear, "weight", amount=0.25)
    assert bool((kept_per_group(linear.weight_mask, 4) <= 2).all())
    assert int((linear.weight_mask == 0).sum()) == 24 + round(0.25 * 24)


def test_remove_makes_the_pattern_permanent() -> None:
    linear = nn.Linear(8, 2)
    weight = linear.weight
    NMSparsity.apply(linear, "weight", n=2, m=4)
    expected = linear.weight.detach().clone()
    prunereg.remove(linear, "weight")
    assert linear.weight is weight
    assert torch.equal(linear.weight.detach(), expected)
    assert bool((kept_per_group(linear.weight.detach(), 4) == 2).all())


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"n": 4, "m": 4}, ValueError),
        ({"n": 0, "m": 4}, ValueError),
        ({"n": 3, "m": 2}, ValueError),
        ({"n": -1, "m": 4}, ValueError),
        ({"n": 2.0, "m": 4}, TypeError),
        ({"n": 2, "m": "4"}, TypeError),
        ({"n": True, "m": 4}, TypeError),
    ],
)
def test_invalid_n_or_m_is_rejected(kwargs: dict, error: type) -> None:
    with pytest.raises(error, match=r"n|m"):
        NMSparsity(**kwargs)


@pytest.mark.parametrize(
    ("shape", "kwargs", "error", "match"),
    [
        ((3, 6), {}, ValueError, "multiple of 4"),
        ((6, 8), {"dim": 0}, ValueError, "multiple of 4"),
        ((3, 8), {"dim": 2}, IndexError, "Invalid index"),
        ((3, 8), {"dim": -3}, IndexError, "Invalid index"),
    ],
)
def test_bad_tensor_raises_and_leaves_the_module_untouched(shape, kwargs, error, match) -> None:
    module = nn.Module()
    weight = nn.Parameter(torch.randn(shape))
    module.weight = weight
    with pytest.raises(error, match=match):
        NMSparsity.apply(module, "weight", **kwargs)
    assert module.weight is weight
    assert list(module.state_dict()) == ["weight"]
    assert not prunereg.is_pruned(module)


def test_scalar_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one dimension"):
        NMSparsity().compute_mask(torch.tensor(1.0), torch.tensor(1.0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="to_sparse_semi_structured needs a CUDA GPU")
def test_two_of_four_is_accepted_by_to_sparse_semi_structured() -> None:
    from torch.sparse import to_sparse_semi_structured

    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("semi-structured sparse kernels need compute capability 8.0 or newer")
    torch.manual_seed(0)
    linear = nn.Linear(128, 64, bias=False).half().cuda()
    NMSparsity.apply(linear, "weight", n=2, m=4)
    dense = linear.weight.detach()
    sparse = to_sparse_semi_structured(dense)
    assert torch.equal(sparse.to_dense(), dense)
    x = torch.randn(128, 32, dtype=torch.half, device="cuda")
    torch.testing.assert_close(torch.mm(sparse, x), torch.mm(dense, x))
