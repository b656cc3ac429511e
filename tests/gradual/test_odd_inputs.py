"""GradualPruning given what a user can give it by mistake: every case a one-line error, or the right thing."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import prunereg
import prunereg.prune as prune
from prunereg._selection.amount import count_for


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 12), nn.ReLU(), nn.Linear(12, 9), nn.ReLU(), nn.Linear(9, 3))


def linear(final: float = 0.5, end: int = 4, **kwargs: int) -> prunereg.Schedule:
    return prunereg.schedule("linear", final=final, end=end, **kwargs)


def unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    now = model.state_dict()
    return now.keys() == before.keys() and all(torch.equal(now[name], value) for name, value in before.items())


def test_a_step_seen_twice_prunes_and_rewinds_once():
    @prunereg.register("regrowing_random", replace=True)
    class RegrowingRandom(prunereg.get("random_unstructured")):  # type: ignore[misc]
        """Random masks drawn afresh at every pruning step."""

        MONOTONE = False

    model = mlp()
    schedule = prunereg.schedule("constant", final=0.5, start=0, end=4, every=2)
    pruner = prunereg.GradualPruning(model, "regrowing_random", schedule, rewind_to=0)
    assert pruner.step(2)
    masks, weights = model[0].weight_mask.clone(), model[0].weight_orig.detach().clone()
    assert not pruner.step(2)  # Lightning asks again after each batch of an accumulation
    assert torch.equal(model[0].weight_mask, masks)
    assert torch.equal(model[0].weight_orig, weights)


def test_a_step_number_that_jumps_over_the_rewind_point_is_refused_and_changes_nothing():
    model = mlp()
    schedule = prunereg.schedule("linear", final=0.5, start=4, end=8, every=2)
    pruner = prunereg.GradualPruning(model, "l1_unstructured", schedule, rewind_to=3)
    pruner.step(2)
    state, before = pruner.state_dict(), copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="jumps from step 2 to step 5 over rewind_to=3") as raised:
        pruner.step(5)
    assert "\n" not in str(raised.value)
    assert pruner.state_dict() == state
    assert unchanged(model, before)
    pruner.step(3)  # the rewind point, then on
    assert pruner.step(6)


@pytest.mark.parametrize("rewind_to", [4, 10])
def test_a_rewind_point_at_or_after_the_last_pruning_step_is_refused_before_training(rewind_to):
    model = mlp()
    with pytest.raises(ValueError, match=f"rewind_to={rewind_to} is not before the schedule's last pruning step 4"):
        prunereg.GradualPruning(model, "l1_unstructured", linear(), rewind_to=rewind_to)
    assert not prunereg.is_pruned(model)


def test_parameters_on_meta_are_refused_in_one_line_and_left_as_they_were():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"0\.weight is on the meta device") as raised:
        prunereg.GradualPruning(model, "l1_unstructured", linear())
    assert "\n" not in str(raised.value)
    assert not prunereg.is_pruned(model)


def test_weights_pruned_before_beyond_the_first_scheduled_level_are_refused_before_training():
    model = mlp()
    prune.l1_unstructured(model[0], "weight", amount=0.4)
    before = copy.deepcopy(model.state_dict())
    schedule = prunereg.schedule("linear", final=0.8, start=0, end=8, every=2)  # 0.2 at step 2, below 0.4
    with pytest.raises(ValueError, match=r"0\.weight has 34 of 84 entries pruned already, more than the 17") as raised:
        prunereg.GradualPruning(model, "l1_unstructured", schedule)
    assert "\n" not in str(raised.value)
    assert unchanged(model, before)


def test_a_structured_method_on_a_vector_gives_torchs_error():
    model = mlp()
    with pytest.raises(ValueError, match=r"'ln_structured' on 0\.bias: .*only be applied to multidimensional tensors"):
        prunereg.GradualPruning(model, "ln_structured", linear(), parameters=[(model[0], "bias")], n=1, dim=0)
    assert not prunereg.is_pruned(model)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"format": 1}, "not a GradualPruning state of format 1: it lacks identity, level"),
        ([1, 2], "not a GradualPruning state of format 1: a list"),
        ({"format": 7}, "not a GradualPruning state of format 1: format 7"),
    ],
)
def test_a_state_that_is_no_pruner_state_is_a_value_error(state, message):
    pruner = prunereg.GradualPruning(mlp(), "l1_unstructured", linear())
    with pytest.raises(ValueError, match=message):
        pruner.load_state_dict(state)
    assert pruner.steps_done == 0


def test_a_state_from_another_pruner_names_what_differs():
    saved = prunereg.GradualPruning(mlp(), "l1_unstructured", linear(end=4))
    other = nn.Sequential(nn.Linear(7, 12), nn.ReLU(), nn.Linear(12, 3))
    pruner = prunereg.GradualPruning(other, "l1_unstructured", linear(end=6))
    with pytest.raises(ValueError) as raised:
        pruner.load_state_dict(saved.state_dict())
    message = str(raised.value)
    assert message.startswith("the state was saved by another pruner: its schedule, parameters differ")
    assert "'method'" not in message and "\n" not in message


def test_finish_twice_is_finish_once_and_a_finished_pruner_refuses_to_step():
    model = mlp()
    pruner = prunereg.GradualPruning(model, "l1_unstructured", linear(), rewind_to=0)
    pruner.step(4)
    pruner.finish(permanent=False)
    assert prunereg.is_pruned(model) and "0.weight_rewind" not in model.state_dict()
    pruner.finish()
    pruner.finish()
    assert not prunereg.is_pruned(model)
    assert int((model[0].weight == 0).sum()) == count_for(0.5, 84)
    with pytest.raises(RuntimeError, match="this GradualPruning is finished: build a new one to prune again"):
        pruner.step(5)
    with pytest.raises(RuntimeError, match="this GradualPruning is finished"):
        pruner.sparsities()


def test_a_parameter_whose_pruning_was_removed_by_hand_is_named_at_the_next_step():
    model = mlp()
    pruner = prunereg.GradualPruning(model, "l1_unstructured", linear())
    prunereg.remove(model[2], "weight")
    with pytest.raises(RuntimeError, match=r"2\.weight is no longer pruned \(its weight_orig is gone\)") as raised:
        pruner.step(4)
    assert "\n" not in str(raised.value)


def test_a_model_mid_schedule_survives_deepcopy_and_a_weights_only_load(tmp_path):
    model = mlp()
    pruner = prunereg.GradualPruning(model, "l1_unstructured", linear(), rewind_to=0)
    pruner.step(2)
    torch.save(model, tmp_path / "model.pt")
    with prunereg.safe_globals(nn.Sequential, nn.Linear, nn.ReLU):
        loaded = torch.load(tmp_path / "model.pt", weights_only=True)
    x = torch.randn(3, 7)
    for other in (copy.deepcopy(model), loaded):
        assert other.state_dict().keys() == model.state_dict().keys()
        assert torch.equal(other(x), model(x))
        resumed = prunereg.GradualPruning(other, "l1_unstructured", linear(), rewind_to=0, state=pruner.state_dict())
        assert resumed.sparsities() == pruner.sparsities()  # its own masks, kept
        assert resumed.step(3)
        assert [int((layer.weight_mask == 0).sum()) for layer in other[::2]] == [32, 40, 10]  # 0.375 of 84, 108, 27


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_parameters_get_the_exact_count_and_stay_zero_through_weight_decay_and_momentum(dtype):
    model = mlp().to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    pruner = prunereg.GradualPruning(model, "l1_unstructured", linear(end=6, every=2), rewind_to=1)
    for step in range(1, 9):
        model(torch.randn(4, 7, dtype=dtype)).float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        pruner.step()
        for layer in (model[0], model[2], model[4]):
            assert layer.weight_mask.dtype == dtype
            assert int((layer.weight_mask == 0).sum()) == count_for(pruner.schedule(step), layer.weight_orig.numel())
            assert bool((layer.weight_orig * layer.weight_mask)[layer.weight_mask == 0].eq(0).all())


@pytest.mark.parametrize(
    ("method", "options", "message"),
    [
        ("flap", {}, r"method 'flap' is a shrink method \(it runs with `prunereg.shrink`, `prunereg shrink`\)"),
        (nn.Linear, {}, "method must be a registered name or a pruning-method class, not <class"),
        ("l1_unstructured", {"amount": 0.3}, "the schedule gives 'l1_unstructured' its amount: leave amount= out"),
        ("wanda", {"sparsity": 0.3}, "the schedule gives 'wanda' its sparsity: leave sparsity= out"),
    ],
)
def test_a_method_or_option_gradual_pruning_cannot_take_is_named(method, options, message):
    model = mlp()
    calibration = [torch.ones(2, 7)] if method == "wanda" else None
    with pytest.raises(TypeError, match=message) as raised:
        prunereg.GradualPruning(model, method, linear(), calibration=calibration, **options)
    assert "\n" not in str(raised.value)
    assert not prunereg.is_pruned(model)


def test_a_calibrated_level_below_what_was_pruned_before_says_so():
    model = mlp()
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    batches = [torch.randn(3, 7, generator=torch.Generator().manual_seed(0))]
    pruner = prunereg.GradualPruning(model, "wanda", linear(final=0.8), calibration=batches)
    with pytest.raises(ValueError, match=r"0\.weight has 42 weights pruned already, and 'wanda' at sparsity 0\.2"):
        pruner.step(1)
