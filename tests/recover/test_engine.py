"""prunereg.recover: refusals change nothing, a method that breaks the contract is put back, worse is undone."""

from __future__ import annotations

import copy
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from torch import nn

import prunereg
from prunereg import RecoveryBlock, RecoveryMethod
from tests.recover.models import assert_unchanged, shrunk, snapshot
from tests.shrink.models import build, calibration_ids, tiny_llama


class _Noise(RecoveryMethod):
    """Makes every block worse: adds noise to its down projection."""

    def recover_block(self, block: RecoveryBlock) -> str | None:
        writer = block.writer("mlp")
        assert writer is not None
        with torch.no_grad():
            writer.weight.add_(torch.randn_like(writer.weight))
        return "noise"


class _Reshape(RecoveryMethod):
    def recover_block(self, block: RecoveryBlock) -> str | None:
        writer = block.writer("mlp")
        assert writer is not None
        writer.weight.data = writer.weight.data[:, :2].clone()
        return None


class _Replace(RecoveryMethod):
    def recover_block(self, block: RecoveryBlock) -> str | None:
        writer = block.writer("mlp")
        assert writer is not None
        writer.weight = nn.Parameter(writer.weight.detach() * 1.01)
        return None


class _AddBias(RecoveryMethod):
    def recover_block(self, block: RecoveryBlock) -> str | None:
        writer = block.writer("mlp")
        assert writer is not None
        writer.bias = nn.Parameter(torch.zeros(writer.out_features))
        return None


class _FillZeros(RecoveryMethod):
    def recover_block(self, block: RecoveryBlock) -> str | None:
        with torch.no_grad():
            for parameter in block.module.parameters():
                parameter.add_(1e-3)
        return None


class _FailsOnSecond(RecoveryMethod):
    """Refits the first block's down projection, then fails."""

    def __init__(self) -> None:
        self.refit = prunereg.get("refit")(writers=("mlp",))

    def recover_block(self, block: RecoveryBlock) -> str | None:
        if block.index == 1:
            with torch.no_grad():
                block.module.mlp.down_proj.weight.mul_(2)
            raise RuntimeError("out of memory, say")
        return self.refit.recover_block(block)


def test_a_method_that_makes_a_block_worse_is_undone_and_the_report_says_so() -> None:
    model, teacher = shrunk("llama", "wanda_sp", {"mlp": 0.5})
    before = snapshot(model)
    report = prunereg.recover(model, teacher, calibration_ids(), _Noise(), progress=False)
    assert report.undone == [0, 1, 2]
    assert all(step.kept_original and step.loss_after == step.loss_before and not step.changed for step in report.steps)
    assert "3 left as they were" in str(report) and "(worse: kept as it was)" in str(report)
    assert_unchanged(model, before)


@pytest.mark.parametrize(
    ("method", "message"),
    [
        (_Reshape(), "changed model.layers.0.mlp.down_proj.weight|changed mlp.down_proj.weight"),
        (_Replace(), "replaced the parameter mlp.down_proj.weight"),
        (_AddBias(), "added the parameter mlp.down_proj.bias"),
    ],
)
def test_a_method_that_changes_the_structure_is_refused_and_the_block_put_back(method: Any, message: str) -> None:
    model, teacher = shrunk("llama", "wanda_sp", {"mlp": 0.5})
    before = snapshot(model)
    with pytest.raises(RuntimeError, match=message) as caught:
        prunereg.recover(model, teacher, calibration_ids(), method, progress=False)
    assert "no block of model.layers was changed" in "".join(getattr(caught.value, "__notes__", []))
    assert_unchanged(model, before)


def test_a_method_that_sets_a_pruned_weight_is_refused_and_every_zero_is_put_back() -> None:
    model = build("llama")
    teacher = copy.deepcopy(model)
    prunereg.oneshot(model, "wanda", calibration=calibration_ids(), sparsity=0.5, progress=False)
    before = snapshot(model)
    with pytest.raises(RuntimeError, match=r"set pruned weights of .*; recovery must keep every zero"):
        prunereg.recover(model, teacher, calibration_ids(), _FillZeros(), progress=False)
    assert_unchanged(model, before)


def test_a_failure_midway_puts_that_block_back_and_says_which_blocks_were_recovered() -> None:
    model, teacher = shrunk("llama", "wanda_sp", {"mlp": 0.5})
    before = snapshot(model)
    with pytest.raises(RuntimeError, match="out of memory") as caught:
        prunereg.recover(model, teacher, calibration_ids(), _FailsOnSecond(), progress=False)
    notes = "".join(getattr(caught.value, "__notes__", []))
    assert "stopped at model.layers.1 (put back as it was); blocks 0 to 0 of model.layers are recovered" in notes
    state = before[0]
    after = model.state_dict()
    assert not torch.equal(after["model.layers.0.mlp.down_proj.weight"], state["model.layers.0.mlp.down_proj.weight"])
    for name, tensor in state.items():
        if not name.startswith("model.layers.0."):
            assert torch.equal(after[name], tensor), name


class _RefitFailsOnFirst(RecoveryMethod):
    """Asks for the MLP writers' biases, refits the first block's, then fails in it."""

    def __init__(self) -> None:
        self.refit = prunereg.get("refit")(writers=("mlp",))

    @property
    def writer_biases(self) -> frozenset[str]:
        return frozenset({"mlp"})

    def recover_block(self, block: RecoveryBlock) -> str | None:
        self.refit.recover_block(block)
        raise RuntimeError("out of memory, say")


def test_a_failure_in_the_first_block_leaves_the_model_and_its_config_as_they_were_biases_switched_off() -> None:
    model, teacher = shrunk("llama", "wanda_sp", {"mlp": 0.5})
    before = snapshot(model)
    with pytest.raises(RuntimeError, match="out of memory"):
        prunereg.recover(model, teacher, calibration_ids(), _RefitFailsOnFirst(), progress=False)
    assert_unchanged(model, before)  # the zero biases switched on for the run, and mlp_bias, gone again


def test_a_failure_after_the_method_ran_in_the_pass_that_measures_it_puts_the_block_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ranks another rank's failure is met in an exchange of that pass (the losses), after the method ran."""
    from prunereg._recover import step

    def fails(*args: Any) -> bool:
        raise RuntimeError("rank 1 of 2 failed: out of memory")

    monkeypatch.setattr(step, "_keep_better", fails)
    model, teacher = shrunk("llama", "wanda_sp", {"mlp": 0.5})
    before = snapshot(model)
    with pytest.raises(RuntimeError, match="rank 1 of 2 failed") as caught:
        prunereg.recover(model, teacher, calibration_ids(), "refit", progress=False)
    assert "no block of model.layers was changed" in "".join(getattr(caught.value, "__notes__", []))
    assert_unchanged(model, before)


def _other_width_teacher() -> nn.Module:
    return build("llama", 1)


REFUSALS: list[tuple[str, Any, type[Exception], str]] = [
    ("no calibration", {"calibration": None}, ValueError, "recover needs calibration data"),
    ("empty calibration", {"calibration": []}, ValueError, "calibration holds no token ids"),
    ("ids outside the vocabulary", {"calibration": torch.full((2, 4), 999)}, ValueError, "vocabulary has 64"),
    ("a teacher of other shapes", {"teacher": "narrow"}, ValueError, "the teacher must be the model before shrinking"),
    ("the model as its own teacher", {"teacher": "self"}, ValueError, "the teacher is the model itself"),
    ("no teacher", {"teacher": None}, TypeError, "teacher must be a torch.nn.Module"),
    ("no blocks found", {"blocks": "model.nothing"}, ValueError, "does not name a non-empty nn.ModuleList"),
    ("an unknown option", {"epochs": 3}, TypeError, "method 'refit' does not take argument 'epochs'"),
    ("a bad option", {"ridge": -1.0}, ValueError, "ridge must be a number >= 0"),
    ("a method of another kind", {"method": "wanda"}, TypeError, "recover needs one of kind recovery"),
    ("an unknown method", {"method": "nope"}, LookupError, "nope"),
    ("a bad setting", {"batch_size": 0}, ValueError, "batch_size must be a positive int"),
    ("removed blocks that are not", {"removed_blocks": [0]}, ValueError, "does not name the 0 blocks"),
]


@pytest.mark.parametrize(("case", "change", "error", "message"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_refusal_is_one_line_and_leaves_the_model_exactly_as_it_was(
    case: str, change: dict[str, Any], error: type[Exception], message: str
) -> None:
    model, teacher = shrunk("llama", "wanda_sp", {"mlp": 0.5})
    arguments: dict[str, Any] = {"teacher": teacher, "calibration": calibration_ids(), "method": "refit"}
    arguments.update(change)
    if arguments["teacher"] == "narrow":
        arguments["teacher"] = shrunk("llama", "wanda_sp", {"mlp": 0.75})[0]
    elif arguments["teacher"] == "self":
        arguments["teacher"] = model
    before = snapshot(model)
    with pytest.raises(error, match=message) as caught:
        prunereg.recover(model, arguments.pop("teacher"), arguments.pop("calibration"), **arguments)
    assert "\n" not in str(caught.value)
    assert_unchanged(model, before)


@pytest.mark.parametrize(
    ("teacher", "message"),
    [
        (lambda: build("qwen2"), "model.layers.0 is a LlamaDecoderLayer and the teacher's model.layers.0 a Qwen2"),
        (lambda: tiny_llama(layers=3, vocab_size=80), r"input embeddings are \(64, 32\) and the teacher's \(80, 32\)"),
    ],
)
def test_a_teacher_of_another_architecture_or_vocabulary_is_refused(teacher: Any, message: str) -> None:
    model, _ = shrunk("llama", "wanda_sp", {"mlp": 0.5})
    before = snapshot(model)
    with pytest.raises(ValueError, match=message):
        prunereg.recover(model, teacher(), calibration_ids())
    assert_unchanged(model, before)


def test_removed_blocks_are_found_as_the_shrink_report_lists_them() -> None:
    model = build("llama", 1)
    teacher = copy.deepcopy(model)
    shrink_report = prunereg.shrink(model, "block_influence", calibration_ids(), layers=1, progress=False)
    found = prunereg.recover(copy.deepcopy(model), teacher, calibration_ids(), "replace", progress=False)
    named = prunereg.recover(
        model, teacher, calibration_ids(), "replace", removed_blocks=shrink_report.removed_blocks, progress=False
    )
    kept = [i for i in range(3) if i not in shrink_report.removed_blocks]
    assert [step.teacher_indices[0] for step in found.steps] == kept
    assert [step.teacher_indices for step in found.steps] == [step.teacher_indices for step in named.steps]


def test_blocks_that_cannot_be_told_apart_need_removed_blocks() -> None:
    model = build("llama", 1)
    teacher = copy.deepcopy(model)
    prunereg.shrink(model, "block_influence", calibration_ids(), layers=1, progress=False)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1e-3)  # as a recovery that trained every tensor leaves it
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"cannot tell which of the teacher's 3 blocks .* \(none of them fits\); pass"):
        prunereg.recover(model, teacher, calibration_ids(), "replace")
    assert_unchanged(model, before)


def test_blocks_alike_in_every_tensor_left_need_removed_blocks() -> None:
    model = build("llama", 1)  # its norms are all ones, as initialised
    teacher = copy.deepcopy(model)
    prunereg.oneshot(model, "wanda", calibration=calibration_ids(), sparsity=0.5, progress=False)
    prunereg.shrink(model, "block_influence", calibration_ids(), layers=1, progress=False)
    with pytest.raises(ValueError, match=r"\(several fit equally well\); pass removed_blocks"):
        prunereg.recover(model, teacher, calibration_ids(), "replace")


@pytest.mark.parametrize(("writers", "passes"), [(("mlp",), 1), (("attention", "mlp"), 2)])
def test_a_refit_runs_one_pass_per_writer_it_solves(writers: tuple[str, ...], passes: int) -> None:
    """The loss before comes from the statistics' pass, the loss after the MLP's refit from a replay of down_proj."""
    model, teacher = shrunk("llama", "wanda_sp", {"mlp": 0.5})
    calls: list[int] = []
    model.model.layers[1].register_forward_hook(lambda *_: calls.append(1))
    report = prunereg.recover(model, teacher, calibration_ids(8, 12), "refit", writers=writers, batch_size=2)
    assert report.undone == []
    checks = {("mlp",): 2, ("attention", "mlp"): 5}[writers]  # on the first batch: does each writer add as it is?
    assert len(calls) == passes * 4 + checks  # a pass is 4 batches


@pytest.mark.parametrize(("dtype", "close"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_the_loss_after_a_refit_and_the_next_blocks_inputs_are_those_of_a_forward(
    dtype: torch.dtype, close: float
) -> None:
    # the refit's outputs come from the statistics' pass plus down_proj's change on its inputs (taken in float32
    # for a half-precision model), not from a second pass: they must be what the block computes all the same
    model, teacher = shrunk("llama", "wanda_sp", {"mlp": 0.5})
    model, teacher = model.to(dtype), teacher.to(dtype)
    ids = calibration_ids(8, 12)
    report = prunereg.recover(model, teacher, ids, "refit", batch_size=2)
    assert report.undone == []
    inputs: list[torch.Tensor] = []
    model.model.layers[1].register_forward_pre_hook(lambda _, args: inputs.append(args[0]))
    targets: list[torch.Tensor] = []
    teacher.model.layers[0].register_forward_hook(lambda *args: targets.append(args[2]))
    with torch.no_grad():
        for batch in ids.split(2):
            model(batch)
            teacher(batch)
    outputs, wanted = torch.cat(inputs).double(), torch.cat([t[0] if isinstance(t, tuple) else t for t in targets])
    assert report.steps[0].loss_after == pytest.approx(float((outputs - wanted.double()).square().mean()), rel=close)


def test_a_block_whose_writers_are_followed_by_norms_is_left_as_it_was_with_its_config() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Gemma2Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
    )  # fmt: skip
    model = transformers.Gemma2ForCausalLM(config).eval()  # a norm after attention and after the MLP
    teacher = copy.deepcopy(model)
    prunereg.shrink(model, "wanda_sp", calibration_ids(), mlp=0.5, progress=False)
    before = snapshot(model)
    report = prunereg.recover(model, teacher, calibration_ids(), "refit", progress=False)
    assert all(step.note == "no down_proj that writes into the residual stream as it is" for step in report.steps)
    report = prunereg.recover(model, teacher, calibration_ids(), "refit", writers=("attention", "mlp"))
    assert all("no o_proj or down_proj that writes into the residual stream" in step.note for step in report.steps)
    assert report.config == {}
    assert_unchanged(model, before)
