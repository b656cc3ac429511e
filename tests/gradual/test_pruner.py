"""GradualPruning: the exact scheduled sparsity at every step, one mask per parameter, resume, compile, bad input."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch._dynamo.testing import CompileCounter

import prunereg
import prunereg.prune as prune
from prunereg._selection.amount import count_for

METHODS = {
    "l1_unstructured": {},
    "random_unstructured": {},
    "ln_structured dim 0": {"n": 2, "dim": 0},
    "ln_structured dim 1": {"n": 1, "dim": 1},
    "random_structured": {"dim": -1},
}


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(7, 12), nn.ReLU(), nn.Linear(12, 9), nn.ReLU(), nn.Linear(9, 3))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(seed))
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def pruned_units(mask: torch.Tensor, dim: int | None) -> int:
    if dim is None:
        return int((mask == 0).sum())
    others = [d for d in range(mask.dim()) if d != dim % mask.dim()]
    return int(((mask != 0).sum(dim=others) == 0).sum())


@settings(max_examples=25, deadline=None)
@given(
    method=st.sampled_from(sorted(METHODS)),
    kind=st.sampled_from(["linear", "cubic", "exponential", "constant"]),
    final=st.floats(0.0, 0.97),
    every=st.integers(1, 4),
    rounds=st.integers(1, 4),
    start=st.integers(0, 3),
)
def test_every_step_prunes_exactly_the_scheduled_count_and_never_unprunes(method, kind, final, every, rounds, start):
    model = mlp()
    options = METHODS[method]
    end = start + every * rounds
    schedule = prunereg.schedule(kind, final=final, start=start, end=None if kind == "constant" else end, every=every)
    torch.manual_seed(1)
    pruner = prunereg.GradualPruning(model, method.split()[0], schedule, **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dim = options.get("dim")
    layers = [model[0], model[2], model[4]]
    hooks = [next(iter(layer._forward_pre_hooks.values())) for layer in layers]
    buffers = [layer.weight_mask for layer in layers]
    previous = [mask.clone() for mask in buffers]
    for step in range(end + 3):
        pruned = True
        if step:
            train_step(model, optimizer, step)
            pruned = pruner.step()
        for layer, hook, buffer, before in zip(layers, hooks, buffers, previous):
            units = layer.weight.numel() if dim is None else layer.weight.shape[dim]
            assert pruned_units(layer.weight_mask, dim) == count_for(schedule(step), units)
            assert not bool(((before == 0) & (layer.weight_mask != 0)).any())  # monotone
            assert layer.weight_mask is buffer and list(layer._forward_pre_hooks.values()) == [hook]
            assert not isinstance(hook, prunereg.PruningContainer)
            if pruned:  # the pruned tensor is brought up to date at once (else at the next forward)
                assert torch.equal(layer.weight, layer.weight_orig * layer.weight_mask)
        previous = [mask.clone() for mask in buffers]


@settings(max_examples=15, deadline=None)
@given(final=st.floats(0.0, 0.97), every=st.integers(1, 3), rounds=st.integers(1, 4))
def test_globally_the_whole_count_is_exact_and_matches_global_unstructured_at_the_first_step(final, every, rounds):
    model, reference = mlp(), mlp()
    schedule = prunereg.schedule("linear", initial=final / 2, final=final, start=0, end=every * rounds, every=every)
    pruner = prunereg.GradualPruning(model, "l1_unstructured", schedule, globally=True)
    pairs = [(reference[i], "weight") for i in (0, 2, 4)]
    prune.global_unstructured(pairs, prune.L1Unstructured, amount=count_for(final / 2, 84 + 108 + 27))
    for (layer, _), mine in zip(pairs, (model[0], model[2], model[4])):
        assert torch.equal(layer.weight_mask, mine.weight_mask)
    for step in range(1, every * rounds + 2):
        pruner.step()
        total = sum(int((model[i].weight_mask == 0).sum()) for i in (0, 2, 4))
        assert total == count_for(schedule(step), 84 + 108 + 27)


def run(model: nn.Module, pruner: prunereg.GradualPruning, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        train_step(model, optimizer, step)
        pruner.step()


def test_stop_and_resume_mid_schedule_gives_the_same_masks_rewind_point_and_next_steps():
    schedule = prunereg.schedule("cubic", final=0.8, start=2, end=14, every=3)

    def fresh() -> tuple[nn.Module, prunereg.GradualPruning, torch.optim.Optimizer]:
        model = mlp()
        pruner = prunereg.GradualPruning(model, "l1_unstructured", schedule, rewind_to=3)
        return model, pruner, torch.optim.Adam(model.parameters(), lr=0.01)

    model, pruner, optimizer = fresh()
    run(model, pruner, optimizer, range(1, 21))

    stopped, stopped_pruner, stopped_optimizer = fresh()
    run(stopped, stopped_pruner, stopped_optimizer, range(1, 10))  # between the pruning steps 8 and 11
    saved = copy.deepcopy(
        {"model": stopped.state_dict(), "pruner": stopped_pruner.state_dict(), "optim": stopped_optimizer.state_dict()}
    )
    resumed, resumed_pruner, resumed_optimizer = fresh()  # a fresh process would build these the same way
    resumed.load_state_dict(saved["model"])
    resumed_pruner.load_state_dict(saved["pruner"])
    resumed_optimizer.load_state_dict(saved["optim"])
    assert resumed_pruner.state_dict() == stopped_pruner.state_dict()
    run(resumed, resumed_pruner, resumed_optimizer, range(10, 21))
    assert resumed.state_dict().keys() == model.state_dict().keys()
    for name, value in model.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
    assert resumed_pruner.state_dict() == pruner.state_dict()


def test_a_state_saved_with_another_schedule_is_refused():
    model = mlp()
    saved = prunereg.GradualPruning(model, "l1_unstructured", prunereg.schedule("cubic", final=0.5, end=10))
    other = prunereg.GradualPruning(mlp(), "l1_unstructured", prunereg.schedule("cubic", final=0.6, end=10))
    with pytest.raises(ValueError, match="the state was saved by"):
        other.load_state_dict(saved.state_dict())


def test_a_parameter_pruned_before_keeps_its_hook_and_its_zeros():
    model = mlp()
    prune.l1_unstructured(model[0], "weight", amount=0.3)
    hook, earlier = model[0]._forward_pre_hooks.copy(), model[0].weight_mask.clone()
    pruner = prunereg.GradualPruning(model, "l1_unstructured", prunereg.schedule("linear", final=0.6, end=4, every=2))
    pruner.step(4)
    assert model[0]._forward_pre_hooks == hook  # the same hook: no container
    assert not bool(((earlier == 0) & (model[0].weight_mask != 0)).any())
    assert int((model[0].weight_mask == 0).sum()) == count_for(0.6, 84)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_compiled_model_is_not_recompiled_when_its_masks_change(fresh_dynamo):
    from torch._dynamo.utils import counters

    model = mlp()
    schedule = prunereg.schedule("cubic", final=0.9, start=0, end=12, every=2)
    pruner = prunereg.GradualPruning(model, "ln_structured", schedule, n=2, dim=0, rewind_to=0)
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    counters.clear()
    x = torch.randn(5, 7)
    for _ in range(1, 15):
        compiled(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        pruner.step()
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
    assert pruner.level == 0.9
    assert counter.frame_count <= 2  # one graph with autograd, one without: none per pruning step
    assert not counters["recompiles"]


def test_a_method_that_lets_weights_regrow_chooses_from_the_original_values():
    @prunereg.register("regrowing_l1", replace=True)
    class RegrowingL1(prunereg.get("l1_unstructured")):  # type: ignore[misc]
        """L1 chosen afresh at each step from the unmasked weights."""

        MONOTONE = False

    model = nn.Sequential(nn.Linear(4, 4))
    schedule = prunereg.schedule("constant", final=0.5, start=0, end=4, every=2)
    pruner = prunereg.GradualPruning(model, "regrowing_l1", schedule)
    pruned = (model[0].weight_mask == 0).nonzero()[0]
    with torch.no_grad():
        model[0].weight_orig[tuple(pruned)] = 100.0  # now the largest weight
    pruner.step(2)
    assert model[0].weight_mask[tuple(pruned)] == 1
    assert int((model[0].weight_mask == 0).sum()) == 8


def test_a_schedule_that_goes_down_is_refused_for_a_method_that_never_unprunes():
    model = mlp()
    with pytest.raises(ValueError, match=r"goes down from 0\.5 at step 10 to 0\.2 at step 20"):
        prunereg.GradualPruning(
            model, "l1_unstructured", prunereg.schedule(lambda t: 0.5 if t < 20 else 0.2, end=20, every=10)
        )
    assert not prunereg.is_pruned(model)


@pytest.mark.parametrize(
    ("method", "options", "error", "message"),
    [
        ("identity", {}, TypeError, "'identity' cannot be given amount="),
        ("custom_from_mask", {}, TypeError, "is 'global': gradual pruning takes an unstructured or structured"),
        (
            "ln_structured",
            {"n": 2, "dim": 2},
            IndexError,
            "'ln_structured' on 0.weight: IndexError: Index is out of bounds",
        ),
        ("sparsegpt", {}, ValueError, "rewrites the weights it keeps"),
        ("wanda", {}, ValueError, "needs calibration="),
        ("wanda", {"pattern": "2:4"}, ValueError, "prunes 0.5 of the weights, but sparsity is 0"),
        ("no_such_method", {}, LookupError, "no_such_method"),
    ],
)
def test_a_method_that_cannot_reach_the_schedule_is_a_one_line_error_before_training(method, options, error, message):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(error, match=message) as raised:
        prunereg.GradualPruning(model, method, prunereg.schedule("linear", final=0.5, end=4), **options)
    assert "\n" not in str(raised.value)
    assert not prunereg.is_pruned(model)
    assert all(torch.equal(model.state_dict()[name], value) for name, value in before.items())


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"globally": True, "method": "ln_structured", "n": 2, "dim": 0}, TypeError, "globally=True needs an unstruct"),
        ({"rewind_to": -1}, ValueError, "rewind_to must be a step number of at least 0"),
        ({"rewind_to": 0, "optimizer_state": "reset"}, ValueError, "needs optimizer="),
        ({"optimizer_state": "zero"}, ValueError, "optimizer_state must be one of keep, reset"),
        ({"parameters": [("weight",)]}, TypeError, r"must be \(module, name\) pairs"),
        ({"calibration": [torch.ones(1, 8)]}, ValueError, "reads no calibration batches"),
    ],
)
def test_bad_arguments_are_one_line_errors(kwargs, error, message):
    model = nn.Sequential(nn.Linear(8, 8))
    method = kwargs.pop("method", "l1_unstructured")
    with pytest.raises(error, match=message):
        prunereg.GradualPruning(model, method, prunereg.schedule("linear", final=0.5, end=4), **kwargs)
    assert not prunereg.is_pruned(model)


def test_a_step_number_that_goes_back_is_refused():
    pruner = prunereg.GradualPruning(mlp(), "l1_unstructured", prunereg.schedule("linear", final=0.5, end=4))
    pruner.step(3)
    with pytest.raises(ValueError, match="at least 3"):
        pruner.step(2)


def test_a_skipped_pruning_step_is_caught_up_at_the_next_step_seen():
    model = mlp()
    schedule = prunereg.schedule("linear", final=0.6, end=6, every=2)
    pruner = prunereg.GradualPruning(model, "l1_unstructured", schedule)
    pruner.step(5)  # steps 2 and 4 were not seen (a resumed run, gradient accumulation)
    assert int((model[0].weight_mask == 0).sum()) == count_for(schedule(5), 84)


def test_a_tied_parameter_is_one_target_pruned_everywhere_and_counted_once():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 6)
            self.hidden = nn.Linear(6, 6)
            self.head = nn.Linear(6, 10, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.hidden(self.embed(ids)))

    model = Tied()
    parameters = [(model, "head.weight"), (model, "embed.weight"), (model.hidden, "weight")]
    pruner = prunereg.GradualPruning(
        model, "l1_unstructured", prunereg.schedule("constant", final=0.5), parameters=parameters
    )
    assert list(pruner.sparsities()) == ["head.weight", "hidden.weight"]
    assert model.head.weight_mask is model.embed.weight_mask
    assert torch.equal(model.head.weight, model.embed.weight)
    assert pruner.sparsity() == 0.5


def test_finish_makes_the_pruning_permanent_and_drops_the_rewind_point():
    model = mlp()
    schedule = prunereg.schedule("linear", final=0.5, end=2)
    pruner = prunereg.GradualPruning(model, "l1_unstructured", schedule, rewind_to=0)
    assert "0.weight_rewind" in model.state_dict()
    pruner.step(2)
    pruner.finish()
    assert not prunereg.is_pruned(model)
    assert set(model.state_dict()) == set(mlp().state_dict())
    assert int((model[0].weight == 0).sum()) == 42


def test_the_summary_names_the_method():
    model = mlp()
    prunereg.GradualPruning(model, "l1_unstructured", prunereg.schedule("constant", final=0.5))
    assert "l1_unstructured" in str(prunereg.summary(model))
