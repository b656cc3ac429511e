"""Both ways with torch.nn.utils.prune: each library sees, removes and prunes again what the other pruned."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg
import prunereg.prune as prune
from prunereg._plugins.kinds import kind_names


def net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def test_prunereg_mask_methods_are_torchs_methods():
    # Calibrated methods (wanda, sparsegpt) prune whole models through prunereg.oneshot, not torch's API.
    names = [name for kind in kind_names(masks=True) for name in prunereg.list_methods(kind)]
    assert "l1_unstructured" in names and "wanda" not in names
    for name in names:
        assert issubclass(prunereg.get(name), torch_prune.BasePruningMethod)
    assert issubclass(prunereg.PruningContainer, torch_prune.BasePruningMethod)


@pytest.mark.parametrize("torch_method", [torch_prune.l1_unstructured, torch_prune.random_unstructured])
def test_prunereg_sees_and_removes_torchs_pruning(torch_method):
    model = net()
    torch_method(model[0], "weight", amount=0.5)
    pruned = model[0].weight.detach().clone()
    assert prunereg.is_pruned(model)
    prunereg.remove(model[0], "weight")
    assert not prunereg.is_pruned(model) and not torch_prune.is_pruned(model)
    assert isinstance(model[0].weight, nn.Parameter) and torch.equal(model[0].weight, pruned)


def test_torch_sees_and_removes_prunereg_pruning():
    model = net()
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    prune.ln_structured(model[0], "weight", amount=2, n=2, dim=0)
    pruned = model[0].weight.detach().clone()
    assert torch_prune.is_pruned(model)
    torch_prune.remove(model[0], "weight")
    assert not torch_prune.is_pruned(model) and not prunereg.is_pruned(model)
    assert torch.equal(model[0].weight, pruned)


@pytest.mark.parametrize("times", [1, 2], ids=["method", "container"])
def test_pruning_again_with_prunereg_continues_torchs_history(times):
    mine, theirs = net(), net()
    for _ in range(times):
        torch_prune.l1_unstructured(mine[0], "weight", amount=0.25)
        torch_prune.l1_unstructured(theirs[0], "weight", amount=0.25)
    prune.ln_structured(mine[0], "weight", amount=2, n=1, dim=0)
    torch_prune.ln_structured(theirs[0], "weight", amount=2, n=1, dim=0)
    assert torch.equal(mine[0].weight_mask, theirs[0].weight_mask)
    hook = next(iter(mine[0]._forward_pre_hooks.values()))
    assert isinstance(hook, prunereg.PruningContainer) and len(hook) == times + 1
    x = torch.randn(4, 6)
    assert torch.equal(mine(x), theirs(x))


def test_global_pruning_on_modules_torch_pruned():
    mine, theirs = net(), net()
    for model in (mine, theirs):
        torch_prune.l1_unstructured(model[0], "weight", amount=0.3)
    prune.global_unstructured([(mine[0], "weight"), (mine[2], "weight")], prune.L1Unstructured, amount=0.5)
    torch_prune.global_unstructured(
        [(theirs[0], "weight"), (theirs[2], "weight")], torch_prune.L1Unstructured, amount=0.5
    )
    for index in (0, 2):
        assert torch.equal(mine[index].weight_mask, theirs[index].weight_mask)


def test_prunereg_state_dict_loading_into_a_model_torch_pruned():
    source, target = net(), net(seed=1)
    prune.l1_unstructured(source[0], "weight", amount=0.5)
    torch_prune.l1_unstructured(target[0], "weight", amount=0.5)
    plain = {k: v for k, v in net(seed=2).state_dict().items()}
    prunereg.load_state_dict(target, plain)
    assert torch.equal(target[0].weight_orig, plain["0.weight"])
    assert torch.equal(target[0].weight, plain["0.weight"] * target[0].weight_mask)


def test_torch_global_pruning_with_a_prunereg_method():
    mine, theirs = net(), net()
    for model, method in ((mine, prunereg.get("l1_unstructured")), (theirs, torch_prune.L1Unstructured)):
        torch_prune.global_unstructured([(model[0], "weight"), (model[2], "weight")], method, amount=10)
    assert torch.equal(mine[0].weight_mask, theirs[0].weight_mask)
    assert torch.equal(mine[2].weight_mask, theirs[2].weight_mask)
