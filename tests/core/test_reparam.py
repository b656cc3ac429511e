"""The reparametrization: <name>_orig, <name>_mask, the forward pre-hook, rollback, remove, is_pruned."""

from __future__ import annotations

import copy
import itertools
import weakref

import pytest
import torch
from torch import nn

import prunereg
from prunereg import BasePruningMethod, PruningContainer
from prunereg.prune import L1Unstructured, LnStructured, custom_from_mask, l1_unstructured, ln_structured


def test_prune_moves_the_parameter_object_to_orig(device):
    module = nn.Linear(3, 2, device=device)
    weight = module.weight
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    hook = L1Unstructured.apply(module, "weight", amount=2)
    assert module.weight_orig is weight
    assert optimizer.param_groups[0]["params"][0] is weight
    assert "weight" not in module._parameters
    assert module._buffers["weight_mask"].shape == weight.shape
    assert module._buffers["weight_mask"].dtype == weight.dtype
    assert module._buffers["weight_mask"].device == weight.device
    assert list(module._forward_pre_hooks.values()) == [hook]
    assert list(module.state_dict()) == ["bias", "weight_orig", "weight_mask"]
    if device != "meta":
        assert torch.equal(module.weight, weight * module.weight_mask)
        assert int((module.weight_mask == 0).sum()) == 2


def test_gradients_reach_orig_through_the_mask():
    module = nn.Linear(4, 1, bias=False)
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    custom_from_mask(module, "weight", mask)
    module(torch.ones(2, 4)).sum().backward()
    assert torch.equal(module.weight_orig.grad, 2 * mask)


def test_second_pruning_wraps_both_in_a_container():
    module = nn.Conv2d(2, 4, 3)
    first = L1Unstructured.apply(module, "weight", amount=0.2)
    container = LnStructured.apply(module, "weight", amount=1, n=2, dim=0)
    assert isinstance(container, PruningContainer)
    assert container[0] is first and isinstance(container[1], LnStructured)
    third = L1Unstructured.apply(module, "weight", amount=3)
    assert third is container and len(container) == 3
    assert list(module._forward_pre_hooks.values()) == [container]


def test_two_hooks_on_one_tensor_are_refused():
    module = nn.Linear(2, 2)
    hook = L1Unstructured.apply(module, "weight", amount=1)
    module.register_forward_pre_hook(copy.copy(hook))
    with pytest.raises(AssertionError, match="multiple pruning hooks"):
        L1Unstructured.apply(module, "weight", amount=1)


def test_pruning_a_non_parameter_is_a_type_error_and_changes_nothing():
    module = nn.BatchNorm1d(3)
    before = state_of(module, "running_mean")
    with pytest.raises(TypeError):
        l1_unstructured(module, "running_mean", amount=1)
    assert state_of(module, "running_mean") == before


# --- rollback -----------------------------------------------------------------------------


def identity(value: object) -> object:
    """``value`` in a form that compares by identity for objects, by value for plain data."""
    if isinstance(value, (str, int, float, type(None))):
        return value
    if isinstance(value, tuple):
        return tuple(identity(v) for v in value)
    if isinstance(value, weakref.ref):
        return ("weakref", id(value()))
    return id(value)


def state_of(module: nn.Module, name: str) -> tuple:
    """Everything pruning may touch, by identity, in order."""
    return (
        [(k, id(v)) for k, v in module._parameters.items()],
        [(k, id(v)) for k, v in module._buffers.items()],
        [(k, id(v)) for k, v in module._forward_pre_hooks.items()],
        id(module.__dict__.get(name)),
        [
            {k: identity(v) for k, v in h.__dict__.items()}
            for h in module._forward_pre_hooks.values()
            if isinstance(h, BasePruningMethod)
        ],
    )


def raising(*args, **kwargs):
    raise RuntimeError("injected failure")


STAGES = ["construct", "scores", "compute_mask", "register_buffer", "apply_mask", "register_hook"]


def fail_at(stage: str, module: nn.Module, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Arrange for the next L1 pruning of ``module.weight`` to fail at ``stage``; its keyword arguments."""
    if stage == "construct":
        return {"amount": -1}
    if stage == "scores":
        return {"amount": 1, "importance_scores": torch.ones(7)}
    if stage == "compute_mask":
        monkeypatch.setattr(L1Unstructured, "compute_mask", raising)
    elif stage == "register_buffer":
        monkeypatch.setattr(module, "register_buffer", raising)
    elif stage == "apply_mask":
        monkeypatch.setattr(BasePruningMethod, "apply_mask", raising)
    elif stage == "register_hook":
        monkeypatch.setattr(module, "register_forward_pre_hook", raising)
    return {"amount": 1}


@pytest.mark.parametrize("earlier", [0, 1, 2], ids=["unpruned", "pruned-once", "container"])
@pytest.mark.parametrize("stage", STAGES)
def test_a_failed_pruning_leaves_the_module_as_it_was(stage, earlier, monkeypatch):
    module = nn.Linear(4, 3)
    for _ in range(earlier):
        l1_unstructured(module, "weight", amount=1)
    x = torch.randn(2, 4)
    out_before = module(x)
    before = state_of(module, "weight")
    with monkeypatch.context() as patch:
        kwargs = fail_at(stage, module, patch)
        with pytest.raises((RuntimeError, ValueError, AssertionError)):
            L1Unstructured.apply(module, "weight", **kwargs)
        assert state_of(module, "weight") == before
    assert prunereg.is_pruned(module) == (earlier > 0)
    assert torch.equal(module(x), out_before)
    copied = copy.deepcopy(module)  # hook state was restored too: deepcopy still finds its tensors
    assert torch.equal(copied(x), out_before)


def test_a_failed_global_pruning_leaves_every_module_as_it_was(monkeypatch):
    first, second = nn.Linear(3, 3), nn.Linear(3, 3)
    l1_unstructured(first, "weight", amount=2)
    before = [state_of(first, "weight"), state_of(second, "weight")]
    monkeypatch.setattr(second, "register_forward_pre_hook", raising)
    with pytest.raises(RuntimeError, match="injected"):
        prunereg.global_unstructured([(first, "weight"), (second, "weight")], L1Unstructured, amount=4)
    assert [state_of(first, "weight"), state_of(second, "weight")] == before


# --- remove ---------------------------------------------------------------------------------


def test_remove_writes_the_pruned_values_into_the_same_parameter(device):
    module = nn.Linear(3, 2, device=device)
    weight = module.weight
    l1_unstructured(module, "weight", amount=3)
    pruned = module.weight.detach().clone()
    assert prunereg.remove(module, "weight") is module
    assert module.weight is weight
    assert not hasattr(module, "weight_orig") and not hasattr(module, "weight_mask")
    assert not module._forward_pre_hooks
    if device != "meta":
        assert torch.equal(module.weight, pruned)


def test_remove_of_an_unpruned_tensor_is_a_value_error():
    module = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="has to be pruned"):
        prunereg.remove(module, "weight")
    l1_unstructured(module, "bias", amount=1)
    with pytest.raises(ValueError, match="has to be pruned"):
        prunereg.remove(module, "weight")


class ThreeParams(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(2, 3))
        self.b = nn.Parameter(torch.randn(3, 2))
        self.c = nn.Parameter(torch.randn(4))


@pytest.mark.parametrize("prune_order", list(itertools.permutations("abc")))
@pytest.mark.parametrize("remove_order", list(itertools.permutations("abc")))
def test_remove_puts_every_parameter_back_in_its_place(prune_order, remove_order):
    module = ThreeParams()
    for name in prune_order:
        l1_unstructured(module, name, amount=1)
    for name in remove_order:
        prunereg.remove(module, name)
    assert [name for name, _ in module.named_parameters()] == ["a", "b", "c"]


def test_remove_after_a_partial_removal_and_repruning_keeps_the_order():
    module = ThreeParams()
    l1_unstructured(module, "a", amount=1)
    l1_unstructured(module, "c", amount=1)
    prunereg.remove(module, "a")
    l1_unstructured(module, "b", amount=1)
    prunereg.remove(module, "c")
    prunereg.remove(module, "b")
    assert [name for name, _ in module.named_parameters()] == ["a", "b", "c"]


def test_remove_in_an_lstm_restores_its_flat_weights():
    lstm = nn.LSTM(4, 4)
    names = [name for name, _ in lstm.named_parameters()]
    l1_unstructured(lstm, "weight_ih_l0", amount=0.5)
    assert sum(isinstance(p, nn.Parameter) for p in lstm._flat_weights) == 3
    prunereg.remove(lstm, "weight_ih_l0")
    assert sum(isinstance(p, nn.Parameter) for p in lstm._flat_weights) == 4
    assert [name for name, _ in lstm.named_parameters()] == names


def test_remove_keeps_a_channels_last_parameter_channels_last():
    conv = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
    l1_unstructured(conv, "weight", amount=0.5)
    pruned = conv.weight.detach().clone()
    prunereg.remove(conv, "weight")
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(conv.weight, pruned)


# --- is_pruned ------------------------------------------------------------------------------


def test_is_pruned_looks_at_every_submodule():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Linear(2, 2)))
    assert not prunereg.is_pruned(model)
    ln_structured(model[1][1], "weight", amount=1, n=1, dim=0)
    assert prunereg.is_pruned(model) and prunereg.is_pruned(model[1])
    assert not prunereg.is_pruned(model[0])
    prunereg.remove(model[1][1], "weight")
    assert not prunereg.is_pruned(model)


def test_other_forward_pre_hooks_are_not_pruning():
    module = nn.Linear(2, 2)
    module.register_forward_pre_hook(lambda m, i: None)
    assert not prunereg.is_pruned(module)
