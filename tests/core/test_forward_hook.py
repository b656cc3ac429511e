"""The forward pre-hook: skips ``orig * mask`` under no_grad when nothing changed, exact otherwise."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg.prune as prune


def net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def pruned_pair(seed: int = 0) -> tuple[nn.Sequential, nn.Sequential]:
    """The same network pruned by prunereg and by torch."""
    mine, theirs = net(seed), net(seed)
    for lib, model in ((prune, mine), (torch_prune, theirs)):
        torch.manual_seed(seed + 1)
        lib.l1_unstructured(model[0], "weight", amount=0.4)
        lib.random_structured(model[2], "weight", amount=1, dim=0)
        lib.l1_unstructured(model[2], "bias", amount=1)
    return mine, theirs


def test_no_grad_forward_reuses_the_pruned_tensor():
    mine, theirs = pruned_pair()
    x = torch.randn(4, 6)
    with torch.no_grad():
        weight = mine[0].weight
        first, second = mine(x), mine(x)
        assert mine[0].weight is weight
        assert torch.equal(first, theirs(x)) and torch.equal(second, first)


def test_grad_forward_recomputes_every_time():
    mine, _ = pruned_pair()
    x = torch.randn(4, 6)
    mine(x)
    weight = mine[0].weight
    mine(x)
    assert mine[0].weight is not weight and mine[0].weight.grad_fn is not None


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.weight_orig.add_(1.0),
        lambda m: m.weight_mask.fill_(1.0),
        lambda m: m.weight_mask.__setitem__((0, 0), 1 - m.weight_mask[0, 0]),
        lambda m: setattr(m.weight_orig, "data", torch.randn_like(m.weight_orig)),
        lambda m: m.register_buffer("weight_mask", torch.ones_like(m.weight_mask)),
        lambda m: m.weight.mul_(3.0),
        lambda m: setattr(m, "weight", torch.zeros_like(m.weight)),
    ],
    ids=[
        "orig in place",
        "mask in place",
        "mask entry",
        "orig .data",
        "new mask buffer",
        "pruned in place",
        "replaced",
    ],
)
def test_changes_under_no_grad_are_picked_up(change):
    mine, _ = pruned_pair()
    layer = mine[0]
    x = torch.randn(4, 6)
    with torch.no_grad():
        mine(x)
        change(layer)
        out = mine(x)
        assert torch.equal(layer.weight, layer.weight_orig * layer.weight_mask)
        assert torch.equal(
            out, mine[2](mine[1](nn.functional.linear(x, layer.weight_orig * layer.weight_mask, layer.bias)))
        )


def test_dtype_and_device_changes_are_picked_up(device):
    mine, _ = pruned_pair()
    x = torch.randn(4, 6)
    with torch.no_grad():
        mine(x)
        mine.to(device=device, dtype=torch.float64)
        out = mine(x.to(device, torch.float64))
    assert mine[0].weight.dtype == torch.float64 and mine[0].weight.device.type == device
    assert out.shape == (4, 3)
    if device != "meta":
        assert torch.equal(mine[0].weight, mine[0].weight_orig * mine[0].weight_mask)


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam])
def test_training_gradients_are_torchs(optimizer):
    mine, theirs = pruned_pair(seed=3)
    opts = [optimizer(m.parameters(), lr=0.1) for m in (mine, theirs)]
    torch.manual_seed(5)
    for _ in range(4):
        x, y = torch.randn(8, 6), torch.randn(8, 3)
        for model, opt in zip((mine, theirs), opts):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        for a, b in zip(mine.parameters(), theirs.parameters()):
            assert torch.equal(a.grad, b.grad) and torch.equal(a, b)
        with torch.no_grad():  # evaluation between steps sees the optimizer's in-place update
            assert torch.equal(mine(x), theirs(x))


def test_inference_mode_is_exact():
    mine, theirs = pruned_pair()
    x = torch.randn(4, 6)
    with torch.inference_mode():
        first = mine(x)
        mine[0].weight_orig.add_(1.0)
        theirs[0].weight_orig.add_(1.0)
        assert torch.equal(mine(x), theirs(x)) and not torch.equal(mine(x), first)


def test_deep_copies_do_not_share_the_shortcut():
    mine, _ = pruned_pair()
    x = torch.randn(4, 6)
    with torch.no_grad():
        mine(x)
        copied = copy.deepcopy(mine)
        copied[0].weight_orig.zero_()
        assert torch.equal(copied(x), copied[2](copied[1](copied[0].bias.expand(4, 5))))
        assert not torch.equal(mine(x), copied(x))
