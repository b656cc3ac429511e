"""Plugin code at run time: a method that exits or raises KeyboardInterrupt fails like any method (issue 20, item 11).

Isolation covered only loading: ``sys.exit(0)`` in ``compute_mask`` or ``prune_group``
ended ``prunereg prune``/``oneshot`` with status 0 and nothing written, and a
plugin's own ``KeyboardInterrupt`` printed "Aborted!" as if the user had pressed
Ctrl-C. Every method class outside prunereg's own packages now runs its
constructor, ``compute_mask`` and ``prune_group`` as plugin code, whichever path
calls them. The classes below are defined in a test module, so they count as
third-party.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from torch import nn

import prunereg
import prunereg.prune
from prunereg._plugins.isolation import PluginCodeError


class ExitsInMask(prunereg.BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        sys.exit(0)


class InterruptsInMask(prunereg.BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        raise KeyboardInterrupt


class ExitsInConstructor(prunereg.BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: float = 0.5) -> None:
        raise SystemExit(3)

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        return default_mask


class PrintsInMask(prunereg.BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: float = 0.5) -> None:
        print("constructing")
        self.amount = amount

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        print("computing a mask")
        return default_mask * (t.abs() > t.abs().median()).to(default_mask.dtype)


class PressesCtrlC(prunereg.BasePruningMethod):
    """The user's Ctrl-C arriving while the method runs (a SIGINT, as the terminal sends it)."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        signal.raise_signal(signal.SIGINT)
        return default_mask


class ExitsInGroup(prunereg.CalibratedMethod):
    def prune_group(
        self, weights: Sequence[torch.Tensor], statistics: prunereg.LayerStatistics, sparsities: Sequence[float]
    ) -> list[prunereg.PrunedWeight]:
        sys.exit(0)


def _layer() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(4, 4)


@pytest.mark.parametrize(
    ("method", "message"),
    [
        (ExitsInMask, r"ExitsInMask\.compute_mask called sys\.exit\(0\); a method must raise an exception to fail"),
        (InterruptsInMask, r"InterruptsInMask\.compute_mask raised KeyboardInterrupt itself \(no Ctrl-C was pressed\)"),
        (ExitsInConstructor, r"ExitsInConstructor\.__init__ called sys\.exit\(3\)"),
    ],
)
def test_apply_turns_an_exit_into_an_error_and_leaves_the_module_as_it_was(method: type, message: str) -> None:
    layer = _layer()
    weight = layer.weight.detach().clone()
    with pytest.raises(PluginCodeError, match=message):
        method.apply(layer, "weight")
    assert not prunereg.is_pruned(layer) and torch.equal(layer.weight, weight)
    assert [name for name, _ in layer.named_parameters()] == ["weight", "bias"]


def test_global_pruning_turns_an_exit_into_an_error() -> None:
    layers = [_layer(), _layer()]
    with pytest.raises(PluginCodeError, match=r"called sys\.exit"):
        prunereg.global_unstructured([(layer, "weight") for layer in layers], ExitsInMask)
    assert not any(prunereg.is_pruned(layer) for layer in layers)


def test_prune_file_turns_an_exit_into_an_error_and_writes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "model.pt"
    torch.save({"layer.weight": torch.randn(4, 4)}, source)
    prunereg.register("exits_in_mask_runtime")(ExitsInMask)
    with pytest.raises(ValueError, match=r"cannot prune 'layer.weight' .*PluginCodeError: .*called sys\.exit\(0\)"):
        prunereg.prune_file(source, tmp_path / "out.pt", "exits_in_mask_runtime")
    assert [path.name for path in tmp_path.iterdir()] == ["model.pt"]


def test_oneshot_turns_an_exit_in_prune_group_into_an_error() -> None:
    pytest.importorskip("transformers")
    from tests.support.tiny_lm import calibration_ids, tiny_llama

    model = tiny_llama()
    with pytest.raises(PluginCodeError, match=r"ExitsInGroup\.prune_group called sys\.exit\(0\)"):
        prunereg.oneshot(model, ExitsInGroup(sparsity=0.5), calibration=calibration_ids())


def test_what_a_method_prints_goes_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    PrintsInMask.apply(_layer(), "weight", amount=0.5)
    out, err = capfd.readouterr()
    assert out == "" and err == "constructing\ncomputing a mask\n"


def test_the_users_ctrl_c_while_a_method_runs_still_stops_the_program() -> None:
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("Python's own SIGINT handler is not installed")
    layer = _layer()
    with pytest.raises(KeyboardInterrupt) as raised:
        PressesCtrlC.apply(layer, "weight")
    assert not isinstance(raised.value, PluginCodeError) and not prunereg.is_pruned(layer)


def test_prunereg_s_own_methods_run_unwrapped() -> None:
    """The guard costs nothing where no plugin code runs: prunereg's own methods are called directly."""
    for name in ("l1_unstructured", "ln_structured", "random_unstructured", "magnitude", "wanda"):
        cls = prunereg.get(name)
        method = getattr(cls, "compute_mask", None) or getattr(cls, "prune_group", None)
        assert method is not None and not hasattr(method, "_prunereg_guarded"), name
    assert hasattr(ExitsInMask.compute_mask, "_prunereg_guarded")
    assert ExitsInMask.compute_mask.__wrapped__.__name__ == "compute_mask"  # type: ignore[attr-defined]
