"""blockwise: each block's loss goes down, a run repeats exactly under its seed, progress is shown."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("transformers")

import torch
from torch import nn

import prunereg
from tests.recover.models import DenseInputsSpy, block_inputs
from tests.support.tiny_lm import calibration_ids, tiny_llama

IDS = calibration_ids(16, 16)


def _shrunk(dtype: torch.dtype = torch.float32) -> tuple[nn.Module, nn.Module]:
    """A 3-block Llama whose weights matter (initializer_range 0.1), its MLP halved, and its teacher."""
    model = tiny_llama(layers=3, initializer_range=0.1).to(dtype)
    teacher = copy.deepcopy(model)
    prunereg.shrink(model, "wanda_sp", IDS, mlp=0.5, progress=False)
    return model, teacher


def test_every_block_ends_closer_to_the_dense_block_than_it_started() -> None:
    model, teacher = _shrunk()
    report = prunereg.recover(model, teacher, IDS, "blockwise", epochs=5, progress=False)
    assert report.undone == []
    for step in report.steps:
        assert step.loss_after < 0.8 * step.loss_before, step
        assert "20 Adam steps at lr 0.001" in step.note
        assert "mlp.down_proj.weight" in step.changed and "input_layernorm.weight" in step.changed


def test_a_run_repeats_exactly_under_its_seed_and_differs_under_another() -> None:
    runs = []
    for seed in (3, 3, 4):
        model, teacher = _shrunk()
        prunereg.recover(model, teacher, IDS, "blockwise", epochs=2, seed=seed, progress=False)
        runs.append(model.state_dict())
    assert all(torch.equal(runs[0][name], runs[1][name]) for name in runs[0])
    assert not all(torch.equal(runs[0][name], runs[2][name]) for name in runs[0])


def test_a_half_precision_block_trains_in_float32_and_keeps_its_dtype() -> None:
    model, teacher = _shrunk(torch.bfloat16)
    report = prunereg.recover(model, teacher, IDS, "blockwise", epochs=3, progress=False)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert any(step.changed for step in report.steps)
    assert all(not p.requires_grad or p.grad is None for p in model.parameters())


def test_the_parameters_train_flags_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    model, teacher = _shrunk()
    model.model.layers[0].mlp.down_proj.weight.requires_grad_(False)
    prunereg.recover(model, teacher, IDS, "blockwise", progress=True)
    assert not model.model.layers[0].mlp.down_proj.weight.requires_grad
    assert all(p.requires_grad for name, p in model.named_parameters() if "layers.0.mlp.down_proj" not in name)
    assert "model.layers.0 blockwise" in capsys.readouterr().err


def test_bad_options_are_refused() -> None:
    for options, message in (({"epochs": 0}, "epochs must be an int >= 1"), ({"lr": 0}, "lr must be a number > 0")):
        with pytest.raises(ValueError, match=message):
            prunereg.get("blockwise")(**options)


def test_a_method_reading_dense_inputs_gets_the_teachers_inputs_to_each_block_and_runs_on_them() -> None:
    model, teacher = _shrunk()
    spy = DenseInputsSpy()
    prunereg.recover(model, teacher, IDS, spy, batch_size=4, progress=False)
    expected = block_inputs(copy.deepcopy(teacher), list(IDS.split(4)))
    assert len(spy.seen) == len(expected) == 3
    for seen, inputs in zip(spy.seen, expected, strict=True):
        for got, want in zip(seen["dense"], inputs, strict=True):
            torch.testing.assert_close(got, want)
    first, last = spy.seen[0], spy.seen[-1]
    # the first block reads the embeddings either way; after a narrowed block the trajectories part
    assert all(torch.equal(a, b) for a, b in zip(first["on dense"], first["on own"], strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(last["dense"], last["own"], strict=True))
    assert not any(torch.allclose(a, b) for a, b in zip(last["on dense"], last["on own"], strict=True))


def test_a_method_not_asking_for_dense_inputs_is_given_its_own_there() -> None:
    model, teacher = _shrunk()
    spy = DenseInputsSpy(asks=False)
    prunereg.recover(model, teacher, IDS, spy, batch_size=4, progress=False)
    assert all(d is o for seen in spy.seen for d, o in zip(seen["dense"], seen["own"], strict=True))


def test_with_dense_inputs_each_block_still_improves_repeats_under_its_seed_and_differs_from_without() -> None:
    runs, reports = [], []
    for dense_inputs in (True, True, False):
        model, teacher = _shrunk()
        method = prunereg.get("blockwise")(epochs=5, dense_inputs=dense_inputs)
        reports.append(prunereg.recover(model, teacher, IDS, method, seed=3, progress=False))
        runs.append(model.state_dict())
    assert all(torch.equal(runs[0][name], runs[1][name]) for name in runs[0])
    assert not all(torch.equal(runs[0][name], runs[2][name]) for name in runs[0])
    for step in reports[0].steps:  # on the student's own trajectory, which it trains on half the time
        assert step.loss_after < 0.9 * step.loss_before, step
        assert "alternate batches on the dense inputs" in step.note
    assert (
        repr(prunereg.get("blockwise")(epochs=5, dense_inputs=True))
        == "Blockwise(epochs=5, lr=0.001, dense_inputs=True)"
    )


def test_dense_inputs_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="dense_inputs must be True or False, not 'yes'"):
        prunereg.get("blockwise")(dense_inputs="yes")


def test_a_block_refuses_dense_inputs_of_another_count_than_its_batches() -> None:
    from prunereg._runtime.capture import BlockInputs

    hidden = [torch.zeros(1, 2, 4)] * 2
    with pytest.raises(ValueError, match="a block needs one dense input per calibration batch: 1 and 2"):
        prunereg.RecoveryBlock(
            nn.Identity(), 0, (0,), BlockInputs(hidden, [()] * 2, [{}] * 2), hidden, writers={}, mlp=None,
            dense_inputs=hidden[:1],
        )  # fmt: skip
