"""Amount and dimension validation: the same answers and error types as torch's private helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.utils.prune as torch_prune
from hypothesis import given, settings
from hypothesis import strategies as st

from prunereg._selection import amount as _amount

amounts = st.one_of(
    st.integers(-5, 50),
    st.floats(-0.5, 1.5, allow_nan=False),
    st.sampled_from([0, 1, 0.0, 1.0, True, False, float("inf"), -float("inf")]),
    st.sampled_from([np.float64(0.3), np.int64(3), np.float32(0.5)]),
)


def outcome(function, *args):
    """What calling ``function`` gives: its result, or the type of the error it raises."""
    try:
        return function(*args)
    except Exception as error:  # any error: its type is the point
        return type(error)


@settings(max_examples=150, deadline=None)
@given(amount=amounts)
def test_validate_amount_init_agrees_with_torch(amount):
    assert outcome(_amount.validate_amount_init, amount) == outcome(torch_prune._validate_pruning_amount_init, amount)


@pytest.mark.parametrize("amount", ["0.5", None, torch.tensor(0.5), [0.5], 1j])
def test_validate_amount_init_rejects_non_real_numbers_with_type_error(amount):
    with pytest.raises(TypeError, match="Invalid type for amount"):
        _amount.validate_amount_init(amount)


def test_nan_amount_is_rejected_at_construction():
    # torch accepts NaN here and fails later, in round(); prunereg says so at once, with the same type.
    with pytest.raises(ValueError, match="amount=nan"):
        _amount.validate_amount_init(float("nan"))
    with pytest.raises(ValueError):
        torch_prune.L1Unstructured(amount=float("nan")).compute_mask(torch.ones(3), torch.ones(3))


@settings(max_examples=150, deadline=None)
@given(amount=st.one_of(st.integers(0, 40), st.floats(0, 1)), size=st.integers(0, 30))
def test_nparams_and_validate_amount_agree_with_torch(amount, size):
    assert _amount.nparams_to_prune(amount, size) == torch_prune._compute_nparams_toprune(amount, size)
    assert outcome(_amount.validate_amount, amount, size) == outcome(torch_prune._validate_pruning_amount, amount, size)


def test_float_amounts_round_half_to_even():
    assert _amount.nparams_to_prune(0.5, 5) == 2  # round(2.5)
    assert _amount.nparams_to_prune(0.5, 7) == 4  # round(3.5)
    assert _amount.nparams_to_prune(1, 15) == 1
    assert _amount.nparams_to_prune(1.0, 15) == 15


@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (1, 1, 1)])
def test_validate_structured_needs_two_dims(shape):
    t = torch.ones(shape)
    assert outcome(_amount.validate_structured, t) == outcome(torch_prune._validate_structured_pruning, t)
    if len(shape) <= 1:
        with pytest.raises(ValueError, match="multidimensional"):
            _amount.validate_structured(t)


@pytest.mark.parametrize("dim", range(-4, 4))
def test_validate_dim_agrees_with_torch(dim):
    t = torch.ones(2, 3)
    assert outcome(_amount.validate_dim, t, dim) == outcome(torch_prune._validate_pruning_dim, t, dim)


@pytest.mark.parametrize("n", [1, 2, 3, math.inf, -math.inf, "fro", 0.5])
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_compute_norm_agrees_with_torch(n, dim, device):
    t = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0)).to(device)
    ours = _amount.compute_norm(t, n, dim)
    assert ours.shape == (t.shape[dim],)
    assert ours.device == t.device
    if device != "meta":
        assert torch.equal(ours, torch_prune._compute_norm(t, n, dim))
