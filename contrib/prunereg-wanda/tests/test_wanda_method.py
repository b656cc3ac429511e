"""WandaPruning: per-row selection by |W| x input norm, by hand and against a plain-Python reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import prunereg
from prunereg.testing import check_pruning_method
from prunereg_wanda import WandaPruning, wanda_scores

WEIGHT = torch.tensor([[1.0, -2.0, 3.0, 0.6], [4.0, 1.0, -1.0, 2.0]])
NORMS = torch.tensor([2.0, 0.5, 1.0, 4.0])


def reference_mask(scores: torch.Tensor, default_mask: torch.Tensor, amount: float | int) -> torch.Tensor:
    """Row by row: among the entries still kept, prune the lowest scores, the later column first at ties."""
    mask = default_mask.clone()
    for i, (row, alive) in enumerate(zip(scores.tolist(), default_mask.tolist())):
        left = [j for j in range(len(row)) if alive[j]]
        k = amount if isinstance(amount, int) else round(amount * len(left))
        for j in sorted(left, key=lambda j: (row[j], -j))[:k]:
            mask[i, j] = 0
    return mask


def test_hand_computed_example() -> None:
    # Scores |W| * norms: row 0 -> [2, 1, 3, 2.4], row 1 -> [8, 0.5, 1, 8]; half of each row goes.
    mask = WandaPruning(0.5, NORMS).compute_mask(WEIGHT, torch.ones_like(WEIGHT))
    assert mask.tolist() == [[0, 0, 1, 1], [1, 0, 0, 1]]
    # Magnitude alone would keep column 1 of row 0: the activations change the answer.
    by_magnitude = WandaPruning(0.5, torch.ones(4)).compute_mask(WEIGHT, torch.ones_like(WEIGHT))
    assert by_magnitude.tolist() == [[0, 1, 1, 0], [1, 0, 0, 1]]


def test_every_row_loses_the_same_count() -> None:
    torch.manual_seed(0)
    weight = torch.randn(3, 5)
    # round(0.3 * 5) = 2 per row (6 in all), where an unstructured 0.3 would prune round(4.5) = 4.
    mask = WandaPruning(0.3, torch.rand(5)).compute_mask(weight, torch.ones_like(weight))
    assert (mask == 0).sum(dim=1).tolist() == [2, 2, 2]
    mask = WandaPruning(1, torch.rand(5)).compute_mask(weight, torch.ones_like(weight))
    assert (mask == 0).sum(dim=1).tolist() == [1, 1, 1]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 4),
    cols=st.integers(1, 7),
    amount=st.sampled_from([0.0, 0.25, 0.5, 0.7, 1.0, 0, 1]),
    ties=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matches_the_row_by_row_reference(rows, cols, amount, ties, seed) -> None:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randint(-2, 3, (rows, cols), generator=generator).float() if ties else torch.randn(rows, cols, generator=generator)
    norms = torch.randint(0, 3, (cols,), generator=generator).float()
    default_mask = (torch.rand(rows, cols, generator=generator) > 0.3).float()
    if isinstance(amount, int) and amount > int(default_mask.sum(1).min()):
        amount = 0
    mask = WandaPruning(amount, norms).compute_mask(weight, default_mask)
    assert torch.equal(mask, reference_mask(wanda_scores(weight, norms), default_mask, amount))


def test_nan_scores_are_pruned_first() -> None:
    weight = torch.tensor([[1.0, float("nan"), 3.0, 2.0]])
    mask = WandaPruning(1, torch.ones(4)).compute_mask(weight, torch.ones_like(weight))
    assert mask.tolist() == [[1, 0, 1, 1]]


@pytest.mark.parametrize("method", ["wanda", WandaPruning])
def test_follows_the_prunereg_contract(method: str | type) -> None:
    # The amount is per row, not of the whole tensor: torch's exact count does not apply.
    check_pruning_method(method, amount=0.3, activation_norms=torch.rand(12), exact_amount=False)


def test_apply_with_importance_scores_in_place_of_the_weight() -> None:
    linear = nn.Linear(4, 2, bias=False)
    WandaPruning.apply(linear, "weight", amount=0.5, activation_norms=NORMS, importance_scores=WEIGHT)
    assert linear.weight_mask.tolist() == [[0, 0, 1, 1], [1, 0, 0, 1]]
    assert torch.equal(linear.weight, linear.weight_orig * linear.weight_mask)


def test_after_earlier_pruning_acts_on_what_each_row_has_left() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(8, 4)
    prunereg.get("random_unstructured").apply(linear, "weight", amount=0.5)
    before = linear.weight_mask.clone()
    norms = torch.rand(8)
    WandaPruning.apply(linear, "weight", amount=0.5, activation_norms=norms)
    assert bool((linear.weight_mask <= before).all())
    expected = reference_mask(wanda_scores(linear.weight_orig, norms), before, 0.5)
    assert torch.equal(linear.weight_mask, expected)


def test_amount_zero_keeps_the_default_mask() -> None:
    default_mask = torch.tensor([[1.0, 0.0, 1.0]])
    mask = WandaPruning(0.0, torch.ones(3)).compute_mask(torch.ones(1, 3), default_mask)
    assert torch.equal(mask, default_mask)


@pytest.mark.parametrize(
    ("amount", "norms", "error", "match"),
    [
        ("half", torch.ones(4), TypeError, "Invalid type for amount"),
        (1.5, torch.ones(4), ValueError, "amount=1.5"),
        (-1, torch.ones(4), ValueError, "amount=-1"),
        (0.5, [1.0, 1.0, 1.0, 1.0], TypeError, "must be a tensor"),
        (0.5, torch.ones(2, 2), ValueError, "1-D tensor"),
        (0.5, torch.tensor([1.0, -1.0, 1.0, 1.0]), ValueError, "cannot be negative"),
    ],
)
def test_bad_arguments_are_rejected(amount, norms, error, match) -> None:
    with pytest.raises(error, match=match):
        WandaPruning(amount, norms)


@pytest.mark.parametrize(
    ("weight", "kwargs", "match"),
    [
        (torch.randn(2, 4), {"amount": 0.5, "activation_norms": torch.ones(3)}, "3 entries"),
        (torch.randn(2, 4, 1), {"amount": 0.5, "activation_norms": torch.ones(4)}, "2-D"),
        (torch.randn(2, 4), {"amount": 5, "activation_norms": torch.ones(4)}, "amount=5"),
    ],
)
def test_bad_tensor_raises_and_leaves_the_module_untouched(weight, kwargs, match) -> None:
    module = nn.Module()
    module.weight = nn.Parameter(weight)
    original = module.weight
    with pytest.raises(ValueError, match=match):
        WandaPruning.apply(module, "weight", **kwargs)
    assert module.weight is original
    assert list(module.state_dict()) == ["weight"]
    assert not prunereg.is_pruned(module)


def test_int_amount_larger_than_a_row_has_left_is_rejected() -> None:
    default_mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="amount=2"):
        WandaPruning(2, torch.ones(3)).compute_mask(torch.ones(2, 3), default_mask)
