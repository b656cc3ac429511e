"""One pruning call looks a tensor's hooks up once and carries them with the tensor's sites."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg.prune as prune
from prunereg._core import reparam

CALLS = {
    "l1_unstructured": lambda p, m: p.l1_unstructured(m, "weight", amount=0.5),
    "ln_structured": lambda p, m: p.ln_structured(m, "weight", amount=0.5, n=2, dim=0),
    "custom_from_mask": lambda p, m: p.custom_from_mask(m, "weight", torch.eye(4)),
    "global_unstructured": lambda p, m: p.global_unstructured([(m, "weight")], p.L1Unstructured, amount=0.5),
    "remove": lambda p, m: p.remove(m, "weight"),
}


@pytest.fixture
def lookups(monkeypatch):
    """How many times reparam.pruning_hooks scans a module's forward pre-hooks."""
    counted = {"calls": 0}
    scan = reparam.pruning_hooks

    def counting(module, name):
        counted["calls"] += 1
        return scan(module, name)

    monkeypatch.setattr(reparam, "pruning_hooks", counting)
    return counted


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("pruned_before", [False, True])
def test_one_call_scans_the_hooks_once(lookups, call, pruned_before):
    torch.manual_seed(0)
    module, reference = nn.Linear(4, 4), nn.Linear(4, 4)
    reference.load_state_dict(module.state_dict())
    if pruned_before or call == "remove":
        prune.l1_unstructured(module, "weight", amount=0.25)
        torch_prune.l1_unstructured(reference, "weight", amount=0.25)
    lookups["calls"] = 0
    CALLS[call](prune, module)
    assert lookups["calls"] == 1  # 9 to 12 before the sites carried their hooks
    # Behaviour unchanged: what torch does on a twin module.
    CALLS[call](torch_prune, reference)
    assert torch.equal(module.weight, reference.weight)
    assert list(dict(module.named_buffers())) == list(dict(reference.named_buffers()))
    assert [type(h).__name__ for h in module._forward_pre_hooks.values()] == [
        type(h).__name__ for h in reference._forward_pre_hooks.values()
    ]


def test_a_tied_group_listed_twice_in_global_pruning_prunes_as_an_untied_tensor_listed_twice():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight
    untied = nn.Linear(4, 4)
    untied.weight = nn.Parameter(model[0].weight.detach().clone())
    prune.global_unstructured([(model, "0.weight"), (model, "0.weight")], prune.L1Unstructured, amount=4)
    prune.global_unstructured([(untied, "weight"), (untied, "weight")], prune.L1Unstructured, amount=4)
    assert torch.equal(model[0].weight_mask, untied.weight_mask) and int((untied.weight_mask == 0).sum()) == 2
    assert model[1].weight_mask is model[0].weight_mask and torch.equal(model[0].weight, model[1].weight)
