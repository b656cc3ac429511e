"""Importances have what methods have (issue 31 item 5c): a public Group and unit_sums, a conformance kit, a guard."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

import prunereg
from prunereg.testing import check_importance
from prunereg.toolkit import Group, unit_sums


@pytest.mark.parametrize("name", ["magnitude", "random", "taylor"])
def test_every_built_in_importance_keeps_the_contract(name: str) -> None:
    check_importance(name)


class L1(prunereg.Importance):
    """The L1 norm of everything a unit holds, written with the toolkit alone."""

    def __call__(self, group: Group, values: dict[str, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        return unit_sums(group, values, torch.abs)


def test_an_importance_written_with_the_toolkit_passes_and_ranks_by_its_sums() -> None:
    check_importance(L1)
    model = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[3.0, 0.0], [0.0, 1.0], [2.0, 2.0], [0.5, 0.0]]))
        model[0].bias.zero_()
        model[2].weight.zero_()
    prunereg.slim(model, torch.randn(3, 2), ratio=0.5, importance=L1())
    assert model[0].weight.tolist() == [[3.0, 0.0], [2.0, 2.0]]  # the L1 sums 3 and 4 stay, 1 and 0.5 go


class _OneScore(prunereg.Importance):
    def __call__(self, group, values):  # type: ignore[no-untyped-def]
        return torch.zeros(1)


class _Integers(prunereg.Importance):
    def __call__(self, group, values):  # type: ignore[no-untyped-def]
        return torch.arange(group.size)


class _Drifts(prunereg.Importance):
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, group, values):  # type: ignore[no-untyped-def]
        self.calls += 1
        return torch.full((group.size,), float(self.calls))


class _ZeroesValues(prunereg.Importance):
    def __call__(self, group, values):  # type: ignore[no-untyped-def]
        for value in values.values():
            value.zero_()
        return torch.zeros(group.size)


class _LeavesGrad(prunereg.Importance):
    def prepare(self, model, args, kwargs):  # type: ignore[no-untyped-def]
        model(*args).sum().backward()

    def __call__(self, group, values):  # type: ignore[no-untyped-def]
        return torch.zeros(group.size)


@pytest.mark.parametrize(
    ("importance", "message"),
    [
        (_OneScore, "must return one score per unit, a tensor of shape (8,), not (1,)"),
        (_Integers, "scores must be a floating tensor with values, not torch.int64"),
        (_Drifts, "the same seed gave other scores"),
        (_ZeroesValues, "changed the model"),
        (_LeavesGrad, "changed the model"),
        (nn.Linear, "not a prunereg.Importance subclass"),
    ],
)
def test_the_kit_names_the_importance_and_what_it_broke(importance: type, message: str) -> None:
    with pytest.raises(AssertionError, match="importance") as caught:
        check_importance(importance, dtypes=[torch.float32])
    assert message in str(caught.value)


class _Exits(prunereg.Importance):
    def __call__(self, group, values):  # type: ignore[no-untyped-def]
        sys.exit(0)


def test_an_importance_that_exits_fails_as_an_error_and_leaves_the_model_as_it_was() -> None:
    model = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    with pytest.raises(prunereg.PluginCodeError, match=r"_Exits\.__call__ called sys\.exit\(0\)"):
        prunereg.slim(model, torch.randn(3, 2), ratio=0.5, importance=_Exits())
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


def test_prunereg_testing_and_toolkit_publish_them() -> None:
    import prunereg.testing
    import prunereg.toolkit

    assert "check_importance" in prunereg.testing.__all__
    assert {"Group", "unit_sums"} <= set(prunereg.toolkit.__all__)
    assert prunereg.toolkit.Group.__module__.startswith("prunereg.")
    code = "import prunereg.toolkit, sys; print('prunereg._slim.graph' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
