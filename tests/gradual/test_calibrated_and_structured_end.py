"""Calibrated methods on schedule (Wanda from calibration batches), and a structured schedule ending in slim."""

from __future__ import annotations

import torch
from torch import nn

import prunereg
from prunereg._selection.amount import count_for


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 4))


def test_wanda_on_schedule_prunes_each_row_by_the_activations_and_keeps_earlier_zeros():
    model = mlp()
    batches = [torch.randn(5, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    schedule = prunereg.schedule("linear", initial=0.25, final=0.5, start=0, end=2, every=2)
    # The first step, by hand: Wanda's score |W_ij| * ||X_j|| over the calibration inputs of each layer.
    inputs = {}
    hooks = [
        layer.register_forward_pre_hook(lambda m, args, i=i: inputs.setdefault(i, []).append(args[0]))
        for i, layer in enumerate(model)
        if isinstance(layer, nn.Linear)
    ]
    with torch.no_grad():
        for batch in batches:
            model(batch)
    for hook in hooks:
        hook.remove()
    pruner = prunereg.GradualPruning(model, "wanda", schedule, calibration=batches)
    for i in (0, 2, 4):
        norms = torch.cat(inputs[i]).square().sum(0).sqrt()
        scores = model[i].weight_orig.detach().abs() * norms
        k = count_for(0.25, scores.shape[1])
        lowest = scores.argsort(dim=1, stable=True)[:, :k]
        expected = torch.ones_like(scores).scatter_(1, lowest, 0)
        assert torch.equal(model[i].weight_mask, expected), i
    earlier = [model[i].weight_mask.clone() for i in (0, 2, 4)]
    pruner.step(2)
    for i, before in zip((0, 2, 4), earlier):
        mask = model[i].weight_mask
        assert ((mask == 0).sum(1) == count_for(0.5, mask.shape[1])).all()  # each row, exactly
        assert not bool(((before == 0) & (mask != 0)).any())


def test_a_structured_schedule_ends_in_slim_with_the_same_outputs_and_fewer_parameters():
    model = mlp()
    x = torch.randn(6, 8)
    # Prune the input columns of the layers reading hidden channels: every reader of a channel reads zeros.
    parameters = [(model[2], "weight"), (model[4], "weight")]
    schedule = prunereg.schedule("cubic", final=0.5, start=0, end=6, every=2)
    pruner = prunereg.GradualPruning(model, "ln_structured", schedule, parameters=parameters, n=2, dim=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(6):
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        pruner.step()
    with torch.no_grad():
        masked = model(x)
    report = prunereg.slim(model, x)
    assert (model[0].out_features, model[2].in_features, model[2].out_features, model[4].in_features) == (8, 8, 6, 6)
    assert report.params_after < report.params_before
    with torch.no_grad():
        torch.testing.assert_close(model(x), masked)
