"""prunereg.toolkit: the public building blocks plugins use instead of private modules."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from hypothesis import given, settings
from hypothesis import strategies as st

import prunereg.prune as prune
from prunereg import toolkit
from prunereg._selection import amount as _amount


@pytest.mark.parametrize("amount", [-1, 1.5, -0.1])
def test_check_amount_rejects_what_torch_rejects(amount):
    with pytest.raises(ValueError):
        torch_prune._validate_pruning_amount_init(amount)
    with pytest.raises(ValueError):
        toolkit.check_amount(amount)


def test_check_amount_rejects_a_non_number_with_a_type_error():
    with pytest.raises(TypeError):
        toolkit.check_amount("half")


@pytest.mark.parametrize(
    ("amount", "units", "expected"), [(0.5, 5, 2), (0.5, 7, 4), (3, 10, 3), (1.0, 4, 4), (0, 9, 0)]
)
def test_count_to_prune_rounds_like_torch(amount, units, expected):
    assert toolkit.count_to_prune(amount, units) == expected == torch_prune._compute_nparams_toprune(amount, units)


def test_count_to_prune_rejects_an_int_larger_than_the_units():
    with pytest.raises(ValueError, match="amount=11"):
        toolkit.count_to_prune(11, 10)


def test_prune_lowest_zeroes_exactly_the_k_smallest_magnitudes(device):
    scores = torch.tensor([[0.5, -0.1, 3.0], [-2.0, 0.2, float("nan")]], device=device)
    mask = toolkit.prune_lowest(scores, 3, torch.ones_like(scores), magnitude=True)
    assert mask.shape == scores.shape and mask.device == scores.device
    if device != "meta":
        assert mask.tolist() == [[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]]  # NaN counts as the lowest


def test_prune_lowest_with_k_zero_copies_the_default_mask():
    default = torch.tensor([1.0, 0.0, 1.0])
    mask = toolkit.prune_lowest(torch.arange(3.0), 0, default)
    assert torch.equal(mask, default) and mask.data_ptr() != default.data_ptr()


def test_prune_lowest_keeps_earlier_zeros_and_prunes_the_highest_on_request():
    default = torch.tensor([1.0, 1.0, 0.0, 1.0])
    mask = toolkit.prune_lowest(torch.tensor([4.0, 1.0, 3.0, 2.0]), 1, default, largest=True)
    assert mask.tolist() == [0.0, 1.0, 0.0, 1.0]


def test_all_or_nothing_restores_a_module_when_the_block_fails():
    layer = torch.nn.Linear(3, 2)
    before = list(layer.state_dict())
    with pytest.raises(RuntimeError), toolkit.all_or_nothing([(layer, "weight")]):
        prune.l1_unstructured(layer, "weight", amount=0.5)
        raise RuntimeError("later step failed")
    assert list(layer.state_dict()) == before and not layer._forward_pre_hooks


def test_prune_where_adds_zeros_and_keeps_the_earlier_ones(device):
    default = torch.tensor([[1.0, 0.0], [1.0, 1.0]], device=device)
    selected = torch.tensor([[True, False], [False, False]], device=device)
    mask = toolkit.prune_where(default, selected)
    assert mask.shape == default.shape and mask.device == default.device
    if device != "meta":
        assert mask.tolist() == [[0.0, 0.0], [1.0, 1.0]]
        assert default.tolist() == [[1.0, 0.0], [1.0, 1.0]]  # the input is left alone


@settings(max_examples=60, deadline=None)
@given(fraction=st.floats(0, 1), units=st.integers(0, 10_000))
def test_count_for_is_torchs_rounding_of_a_float_amount(fraction, units):
    expected = torch_prune._compute_nparams_toprune(fraction, units)
    assert toolkit.count_for(fraction, units) == toolkit.count_to_prune(fraction, units) == expected


def test_count_to_prune_rounds_a_fraction_through_count_for(monkeypatch):
    """One rounding rule: count_to_prune's float path is count_for, so changing one changes both."""
    monkeypatch.setattr(_amount, "count_for", lambda fraction, units: 7)
    assert toolkit.count_to_prune(0.5, 10) == 7
    assert toolkit.count_to_prune(3, 10) == 3  # an int stays absolute


def test_the_llm_methods_select_with_the_toolkit_helpers():
    """The built-in calibrated methods keep no private copies of the selection."""
    import prunereg_llm.magnitude
    import prunereg_llm.sparsegpt
    import prunereg_llm.wanda

    assert prunereg_llm.magnitude.lowest_per_row is toolkit.lowest_per_row
    assert prunereg_llm.magnitude.lowest_overall is toolkit.lowest_overall
    assert prunereg_llm.wanda.lowest_n_of_m is toolkit.lowest_n_of_m
    assert prunereg_llm.sparsegpt.lowest_overall is toolkit.lowest_overall
    assert importlib.util.find_spec("prunereg_llm.selection") is None


@pytest.mark.parametrize("n", [2, 1, 0, 3.5, -1, float("inf"), float("-inf"), "fro"])
@pytest.mark.parametrize(("shape", "dim"), [((6, 5), 0), ((6, 5), -1), ((4, 3, 5), 1), ((3, 2, 2, 2), 0)])
def test_channel_norms_equal_torchs_bit_for_bit_for_every_norm_and_dim(n, shape, dim):
    t = torch.randn(shape, generator=torch.Generator().manual_seed(0)).requires_grad_()
    if n == "fro" and len(shape) > 3:  # torch's 'fro' over three dims is a matrix norm, which refuses them
        with pytest.raises(RuntimeError):
            torch_prune._compute_norm(t, n, dim)
        with pytest.raises(RuntimeError):
            toolkit.channel_norms(t, n, dim)
        return
    expected = torch_prune._compute_norm(t, n, dim)
    got = toolkit.channel_norms(t, n, dim)
    assert torch.equal(got, expected)
    assert got.requires_grad  # public: a caller may still differentiate through them


def test_channel_mask_keeps_the_memory_format_and_the_earlier_zeros_of_a_channels_last_weight():
    t = torch.randn(4, 3, 2, 2).to(memory_format=torch.channels_last)
    default_mask = torch.ones_like(t)
    default_mask[1, 0, 0, 0] = 0
    mask = toolkit.channel_mask(t, torch.tensor([1, 3]), 0, default_mask)
    assert mask.is_contiguous(memory_format=torch.channels_last)
    expected = torch.zeros_like(t)
    expected[[1, 3]] = 1
    assert torch.equal(mask, expected * default_mask)
