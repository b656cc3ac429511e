"""A prunereg.oneshot that fails midway leaves the model as it was, or says which blocks it pruned; reports are true."""

from __future__ import annotations

import copy
import signal
import sys
from collections.abc import Sequence

import pytest
import torch
from torch import nn

import prunereg
from prunereg._runtime import mode

pytest.importorskip("transformers")

from tests.support.tiny_lm import NormScore, calibration_ids, tiny_gpt2, tiny_llama


class FailsInBlock(NormScore):
    """Prunes like NormScore until its ``fail_at``-th group, where it raises ``failure``."""

    def __init__(self, fail_at: int, failure: BaseException) -> None:
        super().__init__(0.5)
        self.fail_at, self.failure = fail_at, failure

    def prune_group(self, weights, statistics, sparsities):  # type: ignore[no-untyped-def]
        if len(self.calls) == self.fail_at:
            if isinstance(self.failure, KeyboardInterrupt):
                # The user's Ctrl-C, as the terminal sends it (a method raising KeyboardInterrupt itself is a
                # PluginCodeError): Python's own handler turns the signal into KeyboardInterrupt here.
                signal.raise_signal(signal.SIGINT)
            raise self.failure
        return super().prune_group(weights, statistics, sparsities)


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def _unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    after = model.state_dict()
    return after.keys() == before.keys() and all(torch.equal(after[n], before[n]) for n in before)


@pytest.mark.parametrize("permanent", [True, False])
@pytest.mark.parametrize("failure", [RuntimeError("the method failed"), KeyboardInterrupt()])
@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2])
def test_a_failure_midway_puts_every_pruned_weight_back(build, permanent: bool, failure: BaseException) -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # also when the suite runs with SIGINT ignored
    try:
        model = build()
        before = _state(model)
        parameters = dict(model.named_parameters())
        with pytest.raises(type(failure)):
            prunereg.oneshot(model, FailsInBlock(6, failure), calibration=calibration_ids(2, 8), permanent=permanent)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not prunereg.is_pruned(model)
    assert _unchanged(model, before)
    assert dict(model.named_parameters()) == parameters  # the same Parameter objects, for optimizers holding them


@pytest.mark.parametrize("permanent", [True, False])
@pytest.mark.parametrize("fail_at", [6, 13], ids=["among block 0's experts", "in block 1, block 0's masks folded"])
def test_a_failure_midway_puts_a_mixtures_experts_back(permanent: bool, fail_at: int) -> None:
    from tests.shrink.models import tiny_mixtral

    model = tiny_mixtral()
    before = _state(model)
    parameters = dict(model.named_parameters())
    failing = FailsInBlock(fail_at, RuntimeError("the method failed"))
    with pytest.raises(RuntimeError, match="the method failed"):
        prunereg.oneshot(model, failing, calibration=calibration_ids(2, 8), permanent=permanent)
    assert len(failing.calls) == fail_at and not prunereg.is_pruned(model)
    assert _unchanged(model, before)
    assert dict(model.named_parameters()) == parameters


def test_a_model_restored_after_a_failure_prunes_as_a_fresh_one() -> None:
    model, fresh, ids = tiny_llama(), tiny_llama(), calibration_ids(2, 8)
    with pytest.raises(RuntimeError):
        prunereg.oneshot(model, FailsInBlock(5, RuntimeError("x")), calibration=ids)
    prunereg.oneshot(model, NormScore(0.5), calibration=ids)
    prunereg.oneshot(fresh, NormScore(0.5), calibration=ids)
    assert _unchanged(model, _state(fresh))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11's")
def test_without_restoring_the_error_says_which_blocks_were_pruned() -> None:
    model = tiny_llama(layers=3)
    with pytest.raises(RuntimeError) as raised:
        prunereg.oneshot(model, FailsInBlock(9, RuntimeError("the method failed")), calibration=calibration_ids(2, 8),
                         restore_on_error=False)  # fmt: skip
    assert raised.value.__notes__ == [
        "prunereg.oneshot stopped after pruning blocks 0 to 2 of model.layers, the last perhaps only in part "
        "(restore_on_error=False): the model is half pruned"
    ]
    assert (model.model.layers[0].mlp.up_proj.weight == 0).float().mean() == 0.5
    assert not (model.model.layers[2].mlp.up_proj.weight == 0).any()  # block 2's MLP groups came after the failure


def test_a_failure_before_any_block_is_pruned_adds_nothing() -> None:
    model = tiny_llama()
    before = _state(model)
    with pytest.raises(RuntimeError) as raised:
        prunereg.oneshot(model, FailsInBlock(0, RuntimeError("first")), calibration=calibration_ids(2, 8),
                         restore_on_error=False)  # fmt: skip
    assert not getattr(raised.value, "__notes__", None)
    assert _unchanged(model, before)


@pytest.mark.parametrize(("available", "restored"), [(10**12, True), (1000, False)])
def test_by_default_the_copy_is_kept_when_it_fits_in_memory(monkeypatch, available: int, restored: bool) -> None:
    monkeypatch.setattr(mode, "available_memory", lambda: available)
    model = tiny_llama()
    before = _state(model)
    with pytest.raises(RuntimeError):
        prunereg.oneshot(model, FailsInBlock(6, RuntimeError("x")), calibration=calibration_ids(2, 8))
    assert _unchanged(model, before) is restored


class ClaimsMoreThanItPrunes(NormScore):
    """Returns NormScore's weights with a mask saying everything was pruned (as a method that updates weights)."""

    UPDATES_WEIGHTS = True

    def prune_group(self, weights: Sequence[torch.Tensor], statistics, sparsities):  # type: ignore[no-untyped-def]
        results = super().prune_group(weights, statistics, sparsities)
        return [prunereg.PrunedWeight(r.weight, torch.zeros_like(r.mask)) for r in results]


def test_the_report_gives_the_zeros_the_weights_hold_not_the_methods_mask() -> None:
    model = tiny_llama()
    report = prunereg.oneshot(model, ClaimsMoreThanItPrunes(0.5), calibration=calibration_ids(2, 8))
    assert [layer.sparsity for layer in report.layers] == [0.5] * 14
    assert report.overall_sparsity == 0.5
    up = model.model.layers[0].mlp.up_proj.weight
    assert (up == 0).float().mean() == 0.5


class ZerosBySign(NormScore):
    """NormScore's mask, its weight as ``weight * mask``: negative pruned entries come back as -0.0."""

    def prune_group(self, weights: Sequence[torch.Tensor], statistics, sparsities):  # type: ignore[no-untyped-def]
        results = super().prune_group(weights, statistics, sparsities)
        return [prunereg.PrunedWeight(weight * r.mask, r.mask) for weight, r in zip(weights, results, strict=True)]


def test_a_method_that_keeps_its_kept_weights_is_taken_at_its_mask_with_positive_zeros() -> None:
    # what ranks send each other for such a method is its masks: one process must fill the zeros as every rank does
    model, reference = tiny_llama(), tiny_llama()
    prunereg.oneshot(model, ZerosBySign(0.5), calibration=calibration_ids(2, 8))
    prunereg.oneshot(reference, NormScore(0.5), calibration=calibration_ids(2, 8))
    for (name, weight), expected in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(weight, expected), name
        assert not torch.signbit(weight[weight == 0]).any(), name


def test_the_report_counts_the_zeros_a_conv1d_holds() -> None:
    model = tiny_gpt2()
    reference = copy.deepcopy(model)
    report = prunereg.oneshot(model, NormScore(0.25), calibration=calibration_ids(2, 8))
    attention = report.layers[0]
    assert attention.name == "transformer.h.0.attn.c_attn" and attention.shape == (96, 32)
    weight = model.transformer.h[0].attn.c_attn.weight
    assert attention.sparsity == (weight == 0).float().mean().item() == 0.25
    assert not torch.equal(weight, reference.transformer.h[0].attn.c_attn.weight)
