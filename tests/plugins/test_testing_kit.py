"""prunereg.testing.check_pruning_method: every built-in passes, and each kind of broken method is caught."""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Any

import pytest
import torch

import prunereg
from prunereg.testing import check_pruning_method


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("identity", {}),
        ("l1_unstructured", {"amount": 0.3}),
        ("l1_unstructured", {"amount": 5}),
        ("random_unstructured", {"amount": 0.5}),
        ("random_structured", {"amount": 0.25, "dim": 0}),
        ("random_structured", {"amount": 2, "dim": -1}),
        ("ln_structured", {"amount": 0.3, "n": 2, "dim": 1}),
        ("ln_structured", {"amount": 3, "n": 1, "dim": 0}),
        ("ln_structured", {"amount": 0.5, "n": float("inf"), "dim": -1}),
        ("builtins:l1_unstructured", {"amount": 0.3}),
    ],
)
def test_every_builtin_keeps_the_contract(name: str, kwargs: dict[str, Any]) -> None:
    check_pruning_method(name, **kwargs)


def test_custom_from_mask_keeps_the_contract_with_a_mask_of_the_kit_shape() -> None:
    mask = (torch.rand(8, 12, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    check_pruning_method("custom_from_mask", mask=mask)
    check_pruning_method(prunereg.get("custom_from_mask"), tensor_shape=(3, 4, 5), mask=torch.ones(3, 4, 5))


def test_other_shapes_and_a_class_instead_of_a_name() -> None:
    l1 = prunereg.get("l1_unstructured")
    check_pruning_method(l1, tensor_shape=(7,), amount=0.4)
    check_pruning_method(prunereg.get("ln_structured"), tensor_shape=(4, 3, 5), amount=0.5, n=2, dim=2)


def test_the_kit_leaves_the_callers_random_state_alone() -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    check_pruning_method("random_unstructured", amount=0.5, devices=["cpu"])
    assert torch.equal(torch.rand(3), expected)


def test_importing_prunereg_does_not_load_the_kit() -> None:
    code = "import sys, prunereg; prunereg.list_methods(); print('prunereg.testing' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


# -- broken methods: each violates one rule -----------------------------------------


class Magnitude(prunereg.BasePruningMethod):
    """A correct method to break in subclasses: prunes round(amount * n) smallest |t|."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: float = 0.5) -> None:
        if not isinstance(amount, (int, float)):
            raise TypeError("amount")
        if not 0 <= amount <= 1:
            raise ValueError("amount")
        self.amount = amount

    def count(self, t: torch.Tensor) -> int:
        return round(self.amount * t.numel())

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        mask = default_mask.clone(memory_format=torch.contiguous_format)
        k = self.count(t)
        if k:
            mask.view(-1)[torch.topk(t.abs().reshape(-1), k, largest=False).indices] = 0
        return mask


class WrongShape(Magnitude):
    def compute_mask(self, t, default_mask):
        return super().compute_mask(t, default_mask).reshape(-1)


class WrongDtype(Magnitude):
    def compute_mask(self, t, default_mask):
        return super().compute_mask(t, default_mask).bool()


class MaskOnCpu(Magnitude):
    def compute_mask(self, t, default_mask):
        mask = super().compute_mask(t, default_mask)
        return mask if t.device.type == "cpu" else torch.ones(t.shape, dtype=default_mask.dtype)


class BroadcastingRow(Magnitude):
    def compute_mask(self, t, default_mask):
        return super().compute_mask(t, default_mask)[:1]


class MaskOnMeta(Magnitude):
    def compute_mask(self, t, default_mask):
        return super().compute_mask(t, default_mask).to("meta")


class BroadcastsOnParameters(Magnitude):
    """Right for the plain tensors compute_mask is checked on; a (1, n) mask for the Parameter apply passes."""

    def compute_mask(self, t, default_mask):
        mask = super().compute_mask(t, default_mask)
        return mask[:1] if isinstance(t, torch.nn.Parameter) else mask


class MetaOnParameters(Magnitude):
    def compute_mask(self, t, default_mask):
        mask = super().compute_mask(t, default_mask)
        return mask.to("meta") if isinstance(t, torch.nn.Parameter) else mask


class Scores(Magnitude):
    def compute_mask(self, t, default_mask):
        return super().compute_mask(t, default_mask) * t.abs()


class IgnoresDefaultMask(Magnitude):
    def compute_mask(self, t, default_mask):
        return super().compute_mask(t, torch.ones_like(default_mask))


class PrunesOneEntryAlways(Magnitude):
    def count(self, t):
        return 1


class PrunesOneTooMany(Magnitude):
    def count(self, t):
        k = super().count(t)
        return k + 1 if 0 < k < t.numel() else k


class PrunesLessForMore(Magnitude):
    def count(self, t):
        return super().count(t) if self.amount != 0.75 else 1


class NeverPrunesAll(Magnitude):
    def count(self, t):
        return min(super().count(t), t.numel() - 1)


class AcceptsAnyAmount(Magnitude):
    def __init__(self, amount: float = 0.5) -> None:
        self.amount = amount if isinstance(amount, (int, float)) else 0.5

    def count(self, t):
        return max(0, min(t.numel(), super().count(t)))


class WrongErrorType(Magnitude):
    def __init__(self, amount: float = 0.5) -> None:
        if isinstance(amount, (int, float)) and not 0 <= amount <= 1:
            raise RuntimeError("amount")
        super().__init__(amount)


class NotReproducible(Magnitude):
    calls = itertools.count()

    def compute_mask(self, t, default_mask):
        generator = torch.Generator().manual_seed(next(self.calls))
        drawn = torch.rand(t.shape, generator=generator).to(t.device)
        return super().compute_mask(drawn, default_mask)


class ChangesItsInput(Magnitude):
    def compute_mask(self, t, default_mask):
        return super().compute_mask(t.abs_(), default_mask)


class NeedsValues(Magnitude):
    def compute_mask(self, t, default_mask):
        t.detach().sum().item()
        return super().compute_mask(t, default_mask)


class OnlyTwoDimensional(Magnitude):
    def compute_mask(self, t, default_mask):
        t.shape[1]
        return super().compute_mask(t, default_mask)


class ApplyReturnsNothing(Magnitude):
    @classmethod
    def apply(cls, module, name, **kwargs):
        super().apply(module, name, **kwargs)


class StructuredWithoutDim(Magnitude):
    PRUNING_TYPE = "structured"


class StructuredPartialChannels(Magnitude):
    PRUNING_TYPE = "structured"
    dim = 0


class UnknownKind(Magnitude):
    PRUNING_TYPE = "pointwise"


@pytest.mark.parametrize(
    ("broken", "options", "message"),
    [
        (WrongShape, {}, r"returned shape \(96,\), expected \(8, 12\)"),
        (WrongDtype, {}, r"returned dtype torch.bool, expected torch.float32"),
        (MaskOnCpu, {}, r"mask on cpu, expected meta \(device meta"),
        (BroadcastingRow, {}, r"returned shape \(1, 12\), expected \(8, 12\)"),
        (MaskOnMeta, {}, r"returned a mask on meta, expected cpu \(device cpu"),
        (
            BroadcastsOnParameters,
            {"devices": ["cpu"]},
            r"(mask of shape \(1, 12\) for a parameter of shape \(8, 12\)"
            r"|failed while applying it to a module on cpu: .*shape)",
        ),
        (
            MetaOnParameters,
            {"devices": ["cpu"]},
            r"(mask on meta for a parameter on cpu"
            r"|failed while applying it to a module on cpu: .*meta)",
        ),
        (Scores, {}, r"values other than 0 and 1 \(device cpu, dtype torch.float32\)"),
        (IgnoresDefaultMask, {}, "entries that default_mask had already pruned"),
        (PrunesOneEntryAlways, {}, r"amount=0.0 pruned 1 of 96, expected nothing"),
        (PrunesOneTooMany, {}, r"amount=0.25 pruned 25 of 96, expected round\(amount \* 96\) = 24"),
        (PrunesLessForMore, {"exact_amount": False}, r"more amount pruned less: .* \[0, 24, 48, 1, 96\]"),
        (NeverPrunesAll, {"exact_amount": False}, "amount=1.0 kept 1 entries"),
        (AcceptsAnyAmount, {}, r"amount=-0.5 was accepted, expected ValueError"),
        (WrongErrorType, {}, r"amount=-0.5 raised RuntimeError, expected ValueError"),
        (NotReproducible, {}, "the same seed gave a different mask"),
        (ChangesItsInput, {}, "modified its input tensor"),
        (NeedsValues, {}, r"failed while computing a mask on meta in torch.float32: .*meta"),
        (OnlyTwoDimensional, {}, "failed while applying it a second time on cpu: IndexError"),
        (ApplyReturnsNothing, {}, "apply returned NoneType"),
        (StructuredWithoutDim, {}, "a structured method needs an integer attribute 'dim'"),
        (StructuredPartialChannels, {}, "keep or prune whole channels along dim=0"),
        (UnknownKind, {}, "PRUNING_TYPE must be one of unstructured, structured, global, not 'pointwise'"),
        (dict, {}, "not a prunereg.BasePruningMethod subclass"),
    ],
)
def test_a_broken_method_is_caught_with_a_clear_message(broken: type, options: dict[str, Any], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_pruning_method(broken, **options)


def test_the_correct_method_the_broken_ones_derive_from_passes() -> None:
    check_pruning_method(Magnitude, amount=0.3)
    check_pruning_method(PrunesOneTooMany, exact_amount=False)


def test_an_unknown_name_or_bad_arguments_are_reported_as_assertion_errors() -> None:
    with pytest.raises(AssertionError, match=r"'l1_unstrctured': failed while looking it up.*did you mean"):
        check_pruning_method("l1_unstrctured", amount=0.3)
    with pytest.raises(AssertionError, match=r"failed while constructing it.*TypeError"):
        check_pruning_method("ln_structured", amount=0.3)
