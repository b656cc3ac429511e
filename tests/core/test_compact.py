"""Opt-in compact masks: bool storage, the same pruning, state dicts that load everywhere."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg
import prunereg.prune as prune


def net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3))


def prune_all(lib, model: nn.Module) -> None:
    torch.manual_seed(1)
    lib.l1_unstructured(model[0], "weight", amount=0.4)
    lib.ln_structured(model[1], "weight", amount=1, n=2, dim=0)
    lib.global_unstructured([(model[0], "bias"), (model[1], "bias")], lib.RandomUnstructured, amount=3)


def compact_and_torch() -> tuple[nn.Module, nn.Module]:
    compact, theirs = net(), net()
    with prunereg.compact_masks():
        prune_all(prune, compact)
    prune_all(torch_prune, theirs)
    return compact, theirs


def masks(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if k.endswith("_mask")}


def test_masks_are_bool_and_prune_as_torch_does():
    compact, theirs = compact_and_torch()
    assert all(m.dtype == torch.bool for m in masks(compact).values())
    for key, mask in masks(theirs).items():
        assert torch.equal(masks(compact)[key].to(mask.dtype), mask)
    x = torch.randn(2, 6)
    assert torch.equal(compact(x), theirs(x))
    compact(x).sum().backward()
    theirs(x).sum().backward()
    for a, b in zip(compact.parameters(), theirs.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_the_block_is_opt_in_and_pruning_again_stays_compact():
    model = net()
    prune.l1_unstructured(model[1], "weight", amount=0.2)
    with prunereg.compact_masks():
        prune.l1_unstructured(model[0], "weight", amount=0.2)
    assert model[1].weight_mask.dtype == torch.float32
    prune.l1_unstructured(model[0], "weight", amount=0.5)  # outside the block
    assert model[0].weight_mask.dtype == torch.bool
    assert int((~model[0].weight_mask).sum()) == 6 + 12


def test_masks_that_are_not_zero_one_stay_dense():
    model = net()
    with prunereg.compact_masks():
        prune.custom_from_mask(model[0], "weight", torch.full((5, 6), 0.5))
    assert model[0].weight_mask.dtype == torch.float32


@pytest.mark.parametrize("target", ["torch", "prunereg", "unpruned"])
def test_state_dicts_load_into_torch_prunereg_and_unpruned_models(target):
    compact, theirs = compact_and_torch()
    state = compact.state_dict()
    if target == "unpruned":
        model = net(seed=9)
        prunereg.load_state_dict(model, state)
        x = torch.randn(2, 6)
        assert torch.equal(model(x), compact(x))
        return
    model = net(seed=9)
    prune_all(torch_prune if target == "torch" else prune, model)
    model.load_state_dict(state)
    for key, mask in masks(model).items():
        assert mask.dtype == torch.float32 and torch.equal(mask, masks(theirs)[key])


def test_dense_state_dicts_load_into_compact_models():
    _, theirs = compact_and_torch()
    fresh = net(seed=9)
    with prunereg.compact_masks():
        prune_all(prune, fresh)
    fresh.load_state_dict(theirs.state_dict())
    assert all(m.dtype == torch.bool for m in masks(fresh).values())
    x = torch.randn(2, 6)
    assert torch.equal(fresh(x), theirs(x))


def test_compact_masks_are_a_quarter_of_float32_ones():
    compact, theirs = compact_and_torch()
    size = lambda model: sum(m.numel() * m.element_size() for m in masks(model).values())  # noqa: E731
    assert size(compact) * 4 == size(theirs)
