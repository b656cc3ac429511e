"""The short cuts one pruning call takes on a small layer keep every result and error of the long way."""

from __future__ import annotations

import fractions
import math

import numpy as np
import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg.prune as prune
from prunereg import toolkit


class RecordingLinear(nn.Linear):
    """A layer whose own __setattr__ must see every assignment."""

    def __init__(self) -> None:
        super().__init__(4, 4)
        self.assigned: list[str] = []

    def __setattr__(self, name: str, value: object) -> None:
        if name != "assigned":
            self.__dict__.setdefault("assigned", []).append(name)
        super().__setattr__(name, value)


def test_a_module_with_its_own_setattr_gets_the_pruned_tensor_through_it():
    module = RecordingLinear()
    module.assigned.clear()
    prune.ln_structured(module, "weight", amount=0.5, n=2, dim=0)
    assert "weight" in module.assigned
    assert torch.equal(module.weight, module.weight_orig * module.weight_mask)


def test_the_pruned_tensor_is_a_plain_attribute_of_the_module():
    module = nn.Linear(4, 4)
    prune.ln_structured(module, "weight", amount=0.5, n=2, dim=0)
    assert "weight" in module.__dict__ and "weight" not in module._parameters and "weight" not in module._buffers
    module.weight_orig.data.mul_(2)
    module(torch.ones(1, 4))  # the hook recomputes it, in place of the old one
    assert torch.equal(module.__dict__["weight"], module.weight_orig * module.weight_mask)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("nan_at", [[], [3], [0, 5], list(range(8))])
def test_top_indices_of_nonnegative_scores_rank_nan_lowest_as_without_the_hint(largest, nan_at):
    torch.manual_seed(0)
    scores = torch.rand(8)
    scores[nan_at] = math.nan
    for k in range(9):
        hinted = toolkit.top_indices(scores, k, largest=largest, nonnegative=True)
        plain = toolkit.top_indices(scores, k, largest=largest)
        # the same ranks chosen (NaN as the lowest, -1); among equal ones either may be
        assert sorted(scores[hinted].nan_to_num(-1).tolist()) == sorted(scores[plain].nan_to_num(-1).tolist())
        if not largest:  # the k smallest: NaN first
            assert scores[hinted].isnan().sum() == min(k, len(nan_at))


def test_ln_structured_prunes_a_nan_channel_first_and_otherwise_matches_torch():
    torch.manual_seed(0)
    mine, theirs = nn.Linear(8, 6), nn.Linear(8, 6)
    theirs.load_state_dict(mine.state_dict())
    prune.ln_structured(mine, "weight", amount=2, n=2, dim=0)
    torch_prune.ln_structured(theirs, "weight", amount=2, n=2, dim=0)
    assert torch.equal(mine.weight_mask, theirs.weight_mask)
    with torch.no_grad():
        mine.weight_orig[4, 1] = math.nan
    prune.remove(mine, "weight")
    prune.ln_structured(mine, "weight", amount=3, n=2, dim=0)
    assert not mine.weight_mask[4].any() and int((mine.weight_mask.sum(1) == 0).sum()) == 3


@pytest.mark.parametrize(
    "amount",
    [0.0, 0.5, 1.0, 1.5, -0.1, 0, 3, -1, True, np.float64(0.5), np.int64(2), fractions.Fraction(1, 2), "0.5"],
)
def test_an_amount_is_accepted_or_refused_as_torch_does(amount):
    def outcome(check):
        try:
            check(amount)
        except (TypeError, ValueError) as error:
            return type(error), str(error)
        return None

    assert outcome(prune._validate_pruning_amount_init) == outcome(torch_prune._validate_pruning_amount_init)
    if outcome(torch_prune._validate_pruning_amount_init) is None:
        assert prune._compute_nparams_toprune(amount, 10) == torch_prune._compute_nparams_toprune(amount, 10)


def test_a_default_mask_of_ones_written_to_in_place_is_still_applied():
    from prunereg._selection.channels import channel_mask, ones_like, still_ones

    t = torch.randn(4, 3)
    keep = torch.tensor([0, 2])
    ones = ones_like(t)
    assert still_ones(ones) and not still_ones(torch.ones_like(t))
    assert torch.equal(channel_mask(t, keep, 0, ones), torch.tensor([[1.0] * 3, [0.0] * 3, [1.0] * 3, [0.0] * 3]))
    ones[0] = 0  # a method may change its default mask before using it
    assert not still_ones(ones)
    assert torch.equal(channel_mask(t, keep, 0, ones)[0], torch.zeros(3))


def test_a_method_that_changes_its_default_mask_in_place_gets_it_respected():
    class HalvedThenLn(prune.LnStructured):
        def compute_mask(self, t, default_mask):
            default_mask[:, 0] = 0  # prunes a column first, writing into the mask it was given
            return super().compute_mask(t, default_mask)

    module = nn.Linear(4, 4)
    HalvedThenLn.apply(module, "weight", amount=1, n=2, dim=0)
    assert not module.weight_mask[:, 0].any() and int((module.weight_mask.sum(1) == 0).sum()) == 1


# --- the undo log of a first pruning ----------------------------------------------------------


class MiddleWeight(nn.Module):
    """Parameters around the pruned one, and a buffer a pruning overwrites: their order and objects must come back."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(3))
        self.weight = nn.Parameter(torch.randn(4, 3))
        self.c = nn.Parameter(torch.randn(2))
        self.register_buffer("weight_mask", torch.full((4, 3), 7.0))  # pruning replaces it, as torch's does


def held(module: nn.Module) -> tuple:
    """What a pruning call may change on ``module``, by identity and in order."""
    return (
        [(k, id(v)) for k, v in module._parameters.items()],
        [(k, id(v)) for k, v in module._buffers.items()],
        list(module._forward_pre_hooks.items()),
        module.__dict__.get("weight"),
    )


def test_a_first_pruning_of_a_layer_without_hooks_takes_the_undo_log_and_a_hooked_one_the_snapshot():
    from prunereg._core import reparam

    layer = nn.Linear(3, 3)
    assert isinstance(reparam.all_or_nothing_first(layer, "weight"), reparam._FirstPruning)
    prune.l1_unstructured(layer, "bias", amount=1)
    assert isinstance(reparam.all_or_nothing_first(layer, "weight"), reparam._AllOrNothing)


def test_a_first_pruning_lists_no_snapshot_while_a_second_one_does():
    from prunereg._core import reparam

    seen = []

    class Watching(prune.L1Unstructured):
        def compute_mask(self, t, default_mask):
            seen.append(len(reparam.snapshot_parameters()))
            return super().compute_mask(t, default_mask)

    layer = nn.Linear(3, 3)
    Watching.apply(layer, "weight", amount=1)  # the undo log: nothing for reference counts to explain
    Watching.apply(layer, "weight", amount=1)  # a snapshot of the pruned layer, listed
    assert seen == [0, 1]


@pytest.mark.parametrize("stage", ["register_buffer", "apply_mask", "register_forward_pre_hook"])
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_error_after_the_parameter_moved_leaves_a_first_pruned_layer_exactly_as_it_was(stage, error, monkeypatch):
    module = MiddleWeight()
    weight = module.weight
    before = held(module)

    def fail(*args, **kwargs):
        raise error("injected")

    target = prune.BasePruningMethod if stage == "apply_mask" else module
    monkeypatch.setattr(target, stage, fail)
    with pytest.raises(error, match="injected"):
        prune.l1_unstructured(module, "weight", amount=2)
    monkeypatch.undo()
    assert held(module) == before
    assert module.weight is weight and [name for name, _ in module.named_parameters()] == ["a", "weight", "c"]
    assert torch.equal(module.weight_mask, torch.full((4, 3), 7.0)) and not prune.is_pruned(module)


def test_top_indices_may_rank_a_temporary_in_place_and_choose_the_same_entries():
    scores = torch.tensor([0.5, math.nan, 2.0, math.inf, 0.0, math.nan, 1.0])
    kept = scores.clone()
    for k in range(len(scores) + 1):
        for largest in (True, False):
            plain = toolkit.top_indices(scores, k, largest=largest, nonnegative=True)
            scratch = scores.clone()
            in_place = toolkit.top_indices(scratch, k, largest=largest, nonnegative=True, overwrite=True)
            assert sorted(in_place.tolist()) == sorted(plain.tolist())
            assert not scratch.isnan().any()  # NaN ranked as -1 where they were
    assert torch.equal(scores.isnan(), kept.isnan()) and torch.equal(scores.nan_to_num(), kept.nan_to_num())


# --- registering <name>_orig and <name>_mask -------------------------------------------------


def test_a_plain_layer_registers_its_tensors_without_torchs_registration_methods(monkeypatch):
    mine, theirs = nn.Linear(4, 3), nn.Linear(4, 3)
    theirs.load_state_dict(mine.state_dict())
    calls = []
    for method in ("register_parameter", "register_buffer"):
        original = getattr(nn.Module, method)
        monkeypatch.setattr(
            nn.Module, method, lambda self, *a, _o=original, _m=method, **k: calls.append(_m) or _o(self, *a, **k)
        )
    prune.ln_structured(mine, "weight", amount=1, n=2, dim=0)
    assert calls == []
    torch_prune.ln_structured(theirs, "weight", amount=1, n=2, dim=0)
    assert calls == ["register_parameter", "register_buffer"]
    assert list(mine._parameters) == list(theirs._parameters) and list(mine._buffers) == list(theirs._buffers)
    assert list(mine.state_dict()) == list(theirs.state_dict())


class OwnRegistration(nn.Linear):
    def __init__(self) -> None:
        super().__init__(4, 3)
        self.registered: list[str] = []

    def register_buffer(self, name, tensor, persistent=True):
        self.registered.append(name)
        super().register_buffer(name, tensor, persistent)


class ClassAttribute(nn.Linear):
    weight_orig = "taken"


def test_a_layer_with_its_own_registration_or_a_taken_name_gets_torchs_registration_and_errors():
    module = OwnRegistration()
    prune.l1_unstructured(module, "weight", amount=1)
    assert module.registered == ["weight_mask"]

    mine, theirs = ClassAttribute(4, 3), ClassAttribute(4, 3)
    with pytest.raises(KeyError) as torch_error:
        torch_prune.l1_unstructured(theirs, "weight", amount=1)
    before = list(mine._parameters.items())
    with pytest.raises(KeyError) as error:
        prune.l1_unstructured(mine, "weight", amount=1)
    assert str(error.value) == str(torch_error.value)
    assert list(mine._parameters.items()) == before and not mine._buffers and not mine._forward_pre_hooks


def test_global_registration_hooks_see_a_pruning_register_its_tensors():
    from torch.nn.modules.module import (
        register_module_buffer_registration_hook,
        register_module_parameter_registration_hook,
    )

    module = nn.Linear(4, 3)
    seen = []
    handles = [
        register_module_parameter_registration_hook(lambda module, name, value: seen.append(name)),
        register_module_buffer_registration_hook(lambda module, name, value: seen.append(name)),
    ]
    try:
        prune.ln_structured(module, "weight", amount=1, n=2, dim=0)
    finally:
        for handle in handles:
            handle.remove()
    assert seen == ["weight_orig", "weight_mask"]


def test_a_non_persistent_buffer_the_mask_replaces_becomes_persistent_as_with_torch():
    modules = [nn.Linear(4, 3), nn.Linear(4, 3)]
    for module in modules:
        module.register_buffer("weight_mask", torch.zeros(1), persistent=False)
    prune.l1_unstructured(modules[0], "weight", amount=1)
    torch_prune.l1_unstructured(modules[1], "weight", amount=1)
    mine, theirs = (list(module.state_dict()) for module in modules)
    assert mine == theirs and "weight_mask" in mine
