"""``prunereg.shrink(..., recover=..., steps=...)``: recovery in shrinking's own pass, and shrinking in rounds."""

from __future__ import annotations

import copy
import tempfile
from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import prunereg
from tests.recover.models import DenseInputsSpy, assert_unchanged, block_inputs, logits, snapshot
from tests.shrink.models import build, calibration_ids
from tests.support import tiny_lm

transformers = pytest.importorskip("transformers")


def _float64(architecture: str) -> torch.nn.Module:
    """A model whose refits make their products in float64: two runs on inputs at other addresses agree to the
    last bits. (A float32 model's are made in float32, which BLAS rounds by address: the weights of a damped but
    ill-conditioned fit then move along directions that barely change its output.)"""
    return build(architecture).double()


def _shrunk_then_recovered(architecture: str, method: str, **removes: Any) -> tuple[torch.nn.Module, Any]:
    model = _float64(architecture)
    teacher = copy.deepcopy(model)
    prunereg.shrink(model, method, calibration_ids(), matmul_precision="highest", progress=False, **removes)
    report = prunereg.recover(model, teacher, calibration_ids(), "refit", matmul_precision="highest", progress=False)
    return model, report


#: Qwen2's config has no mlp_bias for FLAP's bias compensation.
FLAP_OPTIONS = {"llama": {}, "qwen2": {"compensate": False}}


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
@pytest.mark.parametrize("removes", [{"mlp": 0.5}, {"heads": 0.5}, {"mlp": 0.5, "heads": 0.5}])
def test_with_a_method_that_observes_the_dense_model_it_equals_shrink_then_recover(
    architecture: str, removes: dict[str, float]
) -> None:
    options = {**removes, **FLAP_OPTIONS[architecture]}
    expected, expected_report = _shrunk_then_recovered(architecture, "flap", **options)
    model = _float64(architecture)
    report = prunereg.shrink(
        model, "flap", calibration_ids(), recover="refit", matmul_precision="highest", progress=False, **options
    )
    assert model.state_dict().keys() == expected.state_dict().keys()
    for name, tensor in expected.state_dict().items():  # equal up to the rounding of BLAS on other addresses
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=1e-9, atol=1e-9, msg=name)
    assert model.config.to_dict() == expected.config.to_dict()
    losses = [step.loss_after for step in expected_report.steps]
    assert [step.loss_after for step in report.recovery.steps] == pytest.approx(losses, rel=1e-9)


def test_with_a_method_that_observes_the_shrunk_model_each_block_is_better_and_stock_reloads_it() -> None:
    model = build("llama")
    report = prunereg.shrink(model, "wanda_sp", calibration_ids(), mlp=0.5, recover="refit", progress=False)
    steps = report.recovery.steps
    assert len(steps) == 3 and all(step.loss_after < step.loss_before for step in steps)
    assert model.config.mlp_bias is True  # refit's bias, switched on for stock from_pretrained
    assert "recovered with refit" in str(report) and report.as_dict()["recovery"]["method"] == "refit"
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = calibration_ids()[:1]
    assert torch.equal(logits(reloaded, ids), logits(model.eval(), ids))


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"layers": 1, "method": "block_influence"}, ValueError, r"^recover='refit' cannot follow layers="),
        ({"mlp": 0.5, "allocation": "global"}, ValueError, r"^recover='refit' needs allocation='uniform'"),
        ({"mlp": 0.5, "recover": "distill"}, ValueError, r"^recover='distill' trains the whole model"),
        ({"mlp": 0.5, "recover": "wanda"}, TypeError, r"^'wanda' is a .* method; recover needs one of kind recovery"),
        ({"mlp": 0.5, "calibration": None}, ValueError, r"^recover='refit' needs calibration data"),
        ({"mlp": 0.5, "recover": 3}, TypeError, r"^recover must be a recovery method's name"),
        ({"mlp": 0.5, "recover": prunereg.get("magnitude_sp")()}, TypeError, r"a RecoveryMethod instance, not"),
        ({"mlp": 0.5, "steps": 0}, ValueError, r"^steps must be a number of rounds"),
        ({"layers": 1, "method": "block_influence", "recover": None, "steps": 2}, ValueError, r"^steps=2 splits"),
        ({"mlp": 0.999, "steps": 3}, ValueError, r"^mlp=0.999 would leave no channel of the 48 in model.layers.0$"),
        ({"mlp": 0.5, "steps": 2, "calibration": None}, ValueError, r"^flap needs calibration data"),
    ],
)
def test_refusals_are_one_line_and_leave_the_model_as_it_was(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    model = build("llama")
    before = snapshot(model)
    arguments = {"method": "flap", "calibration": calibration_ids(), "recover": "refit", **options}
    with pytest.raises(error, match=message) as raised:
        prunereg.shrink(model, progress=False, **arguments)
    assert "\n" not in str(raised.value)
    assert_unchanged(model, before)


def test_a_recovery_that_fails_midway_leaves_the_model_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    from prunereg_recover.refit import Refit

    model = build("llama")
    before = snapshot(model)
    original = Refit.recover_block

    def fails_at_the_second_block(self: Refit, block: Any) -> str | None:
        if block.index == 1:
            raise RuntimeError("refit broke")
        return original(self, block)

    monkeypatch.setattr(Refit, "recover_block", fails_at_the_second_block)
    with pytest.raises(RuntimeError, match="refit broke"):
        prunereg.shrink(model, "wanda_sp", calibration_ids(), mlp=0.5, recover="refit", progress=False)
    assert_unchanged(model, before)


@pytest.mark.parametrize(
    ("share", "steps", "widths"), [(0.5, 2, [36, 24]), (0.75, 3, [36, 24, 12]), (0.5, 3, [40, 32, 24])]
)
def test_steps_remove_what_one_step_removes_in_rounds_of_equal_size(
    share: float, steps: int, widths: list[int]
) -> None:
    model = build("llama")  # 48 MLP channels per block
    report = prunereg.shrink(model, "flap", calibration_ids(), mlp=share, steps=steps, recover="refit", progress=False)
    assert [round_.blocks[0].kept["mlp"] for round_ in report.rounds] == widths
    assert model.config.intermediate_size == widths[-1] == report.blocks[0].kept["mlp"]
    assert report.blocks[0].before["mlp"] == 48 and report.config["intermediate_size"] == [48, widths[-1]]
    assert all(round_.recovery is not None for round_ in report.rounds) and f"in {steps} rounds" in str(report)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = calibration_ids()[:1]
    assert torch.equal(logits(reloaded, ids), logits(model.eval(), ids))


def test_one_step_is_the_plain_shrink() -> None:
    model, expected = build("llama"), build("llama")
    prunereg.shrink(model, "flap", calibration_ids(), mlp=0.5, steps=1, progress=False)
    prunereg.shrink(expected, "flap", calibration_ids(), mlp=0.5, progress=False)
    for name, tensor in expected.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_in_shrinking_a_block_made_worse_is_put_back_and_the_report_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from prunereg_recover.refit import Refit

    original = Refit.recover_block

    def worse_at_the_second_block(self: Refit, block: Any) -> str | None:
        note = original(self, block)
        if block.index == 1:
            with torch.no_grad():
                block.writer("mlp").weight.mul_(10)
        return note

    model, expected = build("llama"), build("llama")
    prunereg.shrink(expected, "wanda_sp", calibration_ids(), mlp=0.5, progress=False)
    monkeypatch.setattr(Refit, "recover_block", worse_at_the_second_block)
    report = prunereg.shrink(model, "wanda_sp", calibration_ids(), mlp=0.5, recover="refit", progress=False)
    assert report.recovery.undone == [1] and "1 left as they were" in str(report)
    weight = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(model.state_dict()[weight], expected.state_dict()[weight])  # as the cut left it


@settings(deadline=None)  # a loaded machine's first import is slow
@given(
    n_units=st.integers(1, 5000),
    share=st.floats(0, 0.999, allow_nan=False),
    steps=st.integers(1, 8),
)
def test_the_rounds_shares_remove_exactly_what_one_step_removes(n_units: int, share: float, steps: int) -> None:
    """Each round's share, rounded as shrink rounds a share, leaves the units planned; the last, one step's."""
    from prunereg._recover.shrinking import round_share

    assume(round(share * n_units) < n_units)  # one step would leave no unit: refused before any round
    units = n_units
    for step in range(1, steps + 1):
        removed = round(round_share(n_units, share, step, steps) * units)  # shrink's own rounding
        assert 0 <= removed <= units
        units -= removed
    assert units == n_units - round(share * n_units)


def test_a_configured_recovery_method_runs_with_its_options_as_shrink_then_recover_would() -> None:
    model = _float64("llama")
    teacher = copy.deepcopy(model)
    prunereg.shrink(model, "flap", calibration_ids(), mlp=0.5, matmul_precision="highest", progress=False)
    prunereg.recover(model, teacher, calibration_ids(), "refit", ridge=0.5, matmul_precision="highest", progress=False)
    configured = prunereg.get("refit")(ridge=0.5)
    shrunk = _float64("llama")
    report = prunereg.shrink(
        shrunk, "flap", calibration_ids(), mlp=0.5, recover=configured, matmul_precision="highest", progress=False
    )
    for name, tensor in model.state_dict().items():  # equal up to the rounding of BLAS on other addresses
        torch.testing.assert_close(shrunk.state_dict()[name], tensor, rtol=1e-9, atol=1e-9, msg=name)
    assert report.recovery.method == repr(configured) and "ridge=0.5" in str(report)
    default = _float64("llama")
    prunereg.shrink(default, "flap", calibration_ids(), mlp=0.5, recover="refit", progress=False)
    down = "model.layers.0.mlp.down_proj.weight"
    assert not torch.allclose(default.state_dict()[down], shrunk.state_dict()[down])  # the option took effect


def test_in_shrinking_a_method_reading_dense_inputs_gets_the_dense_models_inputs_to_each_block() -> None:
    # FLAP observes the dense model: shrinking's pass runs each block on the dense trajectory before its cut
    ids = tiny_lm.calibration_ids(16, 16)
    model = tiny_lm.tiny_llama(layers=3, initializer_range=0.1)
    expected = block_inputs(copy.deepcopy(model), list(ids.split(4)))
    spy = DenseInputsSpy()
    prunereg.shrink(model, "flap", ids, mlp=0.5, recover=spy, batch_size=4, progress=False)
    assert len(spy.seen) == 3
    for seen, want in zip(spy.seen, expected, strict=True):
        for a, b in zip(seen["dense"], want, strict=True):
            torch.testing.assert_close(a, b)
    last = spy.seen[-1]
    assert not any(torch.equal(a, b) for a, b in zip(last["dense"], last["own"], strict=True))  # not the shrunk one


def _blockwise_in_shrinking(method: str, dense_inputs: bool) -> dict[str, torch.Tensor]:
    """A 3-block Llama's weights after ``method`` halves its MLP with ``blockwise`` (2 epochs) in the same pass."""
    model = tiny_lm.tiny_llama(layers=3, initializer_range=0.1)
    recover = prunereg.get("blockwise")(epochs=2, dense_inputs=dense_inputs)
    report = prunereg.shrink(model, method, tiny_lm.calibration_ids(16, 16), mlp=0.5, recover=recover, progress=False)
    assert all(step.changed for step in report.recovery.steps)
    return model.state_dict()


def test_blockwise_on_dense_inputs_in_shrinking_differs_from_blockwise_on_its_own_inputs() -> None:
    with_dense, without = (_blockwise_in_shrinking("flap", dense_inputs) for dense_inputs in (True, False))
    down = "model.layers.{}.mlp.down_proj.weight"
    assert torch.equal(with_dense[down.format(0)], without[down.format(0)])  # block 0: the same inputs either way
    assert not torch.allclose(with_dense[down.format(2)], without[down.format(2)])


def test_where_shrinking_runs_on_the_shrunk_trajectory_the_dense_inputs_are_the_blocks_own() -> None:
    # wanda_sp observes the shrunk model: each dense output came from the block's own inputs
    with_dense, without = (_blockwise_in_shrinking("wanda_sp", dense_inputs) for dense_inputs in (True, False))
    assert all(torch.equal(with_dense[name], without[name]) for name in with_dense)
