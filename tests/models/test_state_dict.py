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
