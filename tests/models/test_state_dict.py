"""prunereg.load_state_dict: state dicts across pruned and unpruned models of one architecture."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import prunereg
import prunereg.prune as prune


def model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 3), nn.Sequential(nn.ReLU(), nn.Linear(3, 2)))


def test_each_tensor_is_translated_its_own_way():
    source, target = model(), model()
    prune.l1_unstructured(source[1][1], "weight", amount=3)  # pruned only in the source
    prune.ln_structured(target[0], "weight", amount=1, n=2, dim=0)  # pruned only in the target
    target_mask = target[0].weight_mask.clone()
    prunereg.load_state_dict(target, source.state_dict())
    assert torch.equal(target[1][1].weight, source[1][1].weight)
    assert isinstance(target[1][1].weight, nn.Parameter)
    assert torch.equal(target[0].weight_orig, source[0].weight)
    assert torch.equal(target[0].weight_mask, target_mask)
    assert torch.equal(target[0].weight, source[0].weight * target_mask)


def test_both_pruned_loads_the_masks_too():
    source, target = model(), model()
    prune.random_unstructured(source[0], "weight", amount=5)
    prune.random_unstructured(target[0], "weight", amount=2)
    prunereg.load_state_dict(target, source.state_dict())
    assert torch.equal(target[0].weight_mask, source[0].weight_mask)
    assert torch.equal(target[0].weight, source[0].weight)


def test_the_caller_state_dict_is_not_changed():
    source = model()
    prune.l1_unstructured(source[0], "bias", amount=1)
    state = source.state_dict()
    keys = list(state)
    prunereg.load_state_dict(model(), state)
    assert list(state) == keys


def test_a_mismatched_state_dict_still_fails_in_strict_mode():
    target = model()
    prune.l1_unstructured(target[0], "weight", amount=1)
    state = model().state_dict()
    del state["1.1.bias"]
    with pytest.raises(RuntimeError, match=r"1\.1\.bias"):
        prunereg.load_state_dict(target, state)
    result = prunereg.load_state_dict(target, state, strict=False)
    assert result.missing_keys == ["1.1.bias"] and result.unexpected_keys == []


@pytest.mark.parametrize("target_pruned", [False, True])
def test_assign_fills_a_model_built_on_meta(target_pruned):
    source = model()
    prune.l1_unstructured(source[0], "weight", amount=4)
    with torch.device("meta"):
        target = model()
    if target_pruned:
        prune.l1_unstructured(target[0], "weight", amount=4)
    prunereg.load_state_dict(target, source.state_dict(), assign=True)
    assert not any(t.is_meta for t in target.state_dict().values())
    x = torch.randn(2, 4)
    assert torch.equal(target(x), source(x))
    assert prunereg.is_pruned(target) == target_pruned


def test_a_slimmed_state_dict_into_a_stock_model_is_refused_in_one_line_with_the_way_to_load_it():
    slimmed = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    prunereg.slim(slimmed, torch.randn(1, 4), ratio=0.25)
    stock = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    before = {key: value.clone() for key, value in stock.state_dict().items()}
    with pytest.raises(RuntimeError) as refused:
        prunereg.load_state_dict(stock, slimmed.state_dict())
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("size mismatch for 0.weight: the state dict's is [6, 4], the model's [8, 4]; ")
    assert "prunereg.apply_slimmed_shapes" in message and "prunereg.safe_globals" in message
    assert all(torch.equal(stock.state_dict()[key], value) for key, value in before.items())  # nothing copied
    # The way the message names loads it.
    prunereg.apply_slimmed_shapes(stock, prunereg.slimmed_shapes(slimmed))
    prunereg.load_state_dict(stock, slimmed.state_dict())
    assert all(torch.equal(stock.state_dict()[key], value) for key, value in slimmed.state_dict().items())


def test_a_larger_tensor_than_the_model_s_is_refused_without_the_slimming_hint():
    small, large = nn.Linear(3, 2), nn.Linear(4, 2)
    with pytest.raises(
        RuntimeError, match=r"^size mismatch for weight: the state dict's is \[2, 4\], the model's \[2, 3\]$"
    ):
        prunereg.load_state_dict(small, large.state_dict())
