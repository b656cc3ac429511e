"""Lottery-ticket rewinding: the kept weights return exactly to their step-k values; the optimizer as asked."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import prunereg


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 4))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(step))
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("k", [0, 3])
def test_after_each_round_the_kept_weights_hold_their_step_k_values_exactly(k):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    schedule = prunereg.schedule("exponential", final=0.8, start=4, end=16, every=4)
    pruner = prunereg.GradualPruning(model, "l1_unstructured", schedule, rewind_to=k, optimizer=optimizer)
    layers = [model[0], model[2]]
    at_k = [layer.weight_orig.detach().clone() for layer in layers] if k == 0 else None
    for step in range(1, 18):
        train_step(model, optimizer, step)
        before = [layer.weight_orig.detach().clone() for layer in layers]
        pruned = pruner.step()
        if step == k:
            at_k = [layer.weight_orig.detach().clone() for layer in layers]
        for layer, saved, trained in zip(layers, at_k or [], before):
            kept = layer.weight_mask != 0
            if pruned and step > 4:
                assert torch.equal(layer.weight_orig[kept], saved[kept])  # the surviving weights, rewound
                assert torch.equal(layer.weight_orig[~kept], trained[~kept])  # the pruned ones left as they were
            assert torch.equal(layer.weight_rewind, saved)
    assert pruner.level == 0.8


def test_the_rewind_point_is_one_copy_of_each_pruned_parameter_and_nothing_more():
    model = mlp()
    plain = sum(t.numel() for t in model.state_dict().values())
    prunereg.GradualPruning(model, "l1_unstructured", prunereg.schedule("linear", final=0.5, end=4), rewind_to=2)
    extra = {name: t for name, t in model.state_dict().items() if name.endswith("_rewind")}
    assert set(extra) == {"0.weight_rewind", "2.weight_rewind"}
    masks = sum(t.numel() for name, t in model.state_dict().items() if name.endswith("_mask"))
    assert sum(t.numel() for t in model.state_dict().values()) == plain + masks + 60 + 40


@pytest.mark.parametrize("choice", ["keep", "reset"])
def test_the_optimizer_state_of_the_pruned_parameters_is_kept_or_reset_as_asked(choice):
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    schedule = prunereg.schedule("linear", final=0.5, start=2, end=4, every=2)
    pruner = prunereg.GradualPruning(
        model, "l1_unstructured", schedule, rewind_to=0, optimizer=optimizer, optimizer_state=choice
    )
    for step in range(1, 4):
        train_step(model, optimizer, step)
        pruner.step()
    train_step(model, optimizer, 4)
    pruner.step()  # the second round: rewound
    pruned_parameters = {id(model[0].weight_orig), id(model[2].weight_orig)}
    held = {id(p) for p in optimizer.state}
    assert held.isdisjoint(pruned_parameters) == (choice == "reset")
    assert id(model[0].bias) in held  # the others' state is never touched
