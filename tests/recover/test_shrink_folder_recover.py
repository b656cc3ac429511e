"""``prunereg.shrink_folder(..., recover=..., steps=...)`` and ``prunereg shrink --stream --recover``: a folder shrunk
and recovered block by block equals the model shrunk and recovered in memory, and a failure writes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import prunereg
from prunereg._cli import main
from tests.shrink.models import build, calibration_ids
from tests.support.processes import run_prunereg

transformers = pytest.importorskip("transformers")

CASES = [
    ("flap", "refit", {"mlp": 0.5}),  # observes the dense model; refit's attention biases stay zero and are taken back
    ("wanda_sp", "refit", {"mlp": 0.5, "heads": 0.5}),  # observes the shrunk model's trajectory
    ("flap", "refit", {"mlp": 0.5, "steps": 2}),
    ("wanda_sp", "refit", {"mlp": 0.75, "heads": 0.5, "steps": 3}),
    pytest.param("wanda_sp", "blockwise", {"mlp": 0.5}, marks=pytest.mark.slow),  # trained with Adam, seeded
    # trained on the dense trajectory's inputs too, which the streamed pass keeps as the in-memory one does
    pytest.param("flap", prunereg.get("blockwise")(dense_inputs=True), {"mlp": 0.5}, marks=pytest.mark.slow),
]


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def _assert_same_weights(folder: Path, model: torch.nn.Module) -> None:
    """``folder`` reloads with stock transformers to ``model``'s tensors, bit for bit, and its index names no more."""
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(folder).state_dict()
    expected = model.state_dict()
    assert reloaded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(reloaded[name], tensor), name
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == {name for name, _ in model.named_parameters()}


def _without_seconds(report: Any) -> Any:
    """A report's plain data less its timings (and its rounds, compared through their result)."""
    if isinstance(report, list):
        return [_without_seconds(item) for item in report]
    if isinstance(report, dict):
        return {key: _without_seconds(value) for key, value in report.items() if key not in ("seconds", "rounds")}
    return report


@pytest.mark.parametrize(("method", "recover", "options"), CASES, ids=lambda v: str(v))
def test_a_folder_shrunk_and_recovered_block_by_block_equals_the_model_in_memory(
    method: str, recover: str, options: dict[str, Any], tmp_path: Path
) -> None:
    build("llama").save_pretrained(tmp_path / "dense")
    in_memory = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense").eval()
    expected = prunereg.shrink(in_memory, method, calibration_ids(), recover=recover, progress=False, **options)
    report = prunereg.shrink_folder(
        tmp_path / "dense", tmp_path / "small", method, calibration_ids(), recover=recover, progress=False, **options
    )
    _assert_same_weights(tmp_path / "small", in_memory)
    assert _without_seconds(report.as_dict()) == _without_seconds(expected.as_dict())
    assert len(report.rounds) == len(expected.rounds) == options.get("steps", 0)
    assert [step.loss_after for step in report.recovery.steps] == [step.loss_after for step in expected.recovery.steps]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dense", "small"]  # no round folder left behind


def test_steps_alone_stream_the_folder_in_rounds_as_in_memory(tmp_path: Path) -> None:
    build("llama").save_pretrained(tmp_path / "dense")
    in_memory = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense").eval()
    prunereg.shrink(in_memory, "wanda_sp", calibration_ids(), mlp=0.5, steps=2, progress=False)
    report = prunereg.shrink_folder(
        tmp_path / "dense", tmp_path / "small", "wanda_sp", calibration_ids(), mlp=0.5, steps=2, progress=False
    )
    assert [round_.blocks[0].kept["mlp"] for round_ in report.rounds] == [36, 24] and report.recovery is None
    _assert_same_weights(tmp_path / "small", in_memory)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"layers": 1, "method": "block_influence"}, ValueError, r"^recover='refit' cannot follow layers="),
        ({"mlp": 0.5, "recover": "distill"}, ValueError, r"^recover='distill' trains the whole model"),
        ({"mlp": 0.5, "calibration": None}, ValueError, r"^recover='refit' needs calibration data"),
        ({"mlp": 0.5, "allocation": "global"}, ValueError, r"^allocation='global' ranks every block's units"),
        ({"mlp": 0.999, "steps": 3}, ValueError, r"^mlp=0.999 would leave no channel of the 48 in model.layers.0$"),
        ({"layers": 1, "method": "block_influence", "recover": None, "steps": 2}, ValueError, r"^steps=2 splits"),
        ({"mlp": 0.5, "restore_on_error": True}, TypeError, r"'restore_on_error' is not taken here"),
    ],
)
def test_refusals_are_one_line_leave_the_folder_as_it_was_and_write_nothing(
    options: dict[str, Any], error: type[Exception], message: str, tmp_path: Path
) -> None:
    build("llama").save_pretrained(tmp_path / "dense")
    before = _files(tmp_path / "dense")
    arguments = {"method": "flap", "calibration": calibration_ids(), "recover": "refit", **options}
    with pytest.raises(error, match=message) as raised:
        prunereg.shrink_folder(tmp_path / "dense", tmp_path / "small", progress=False, **arguments)
    assert "\n" not in str(raised.value)
    assert _files(tmp_path / "dense") == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dense"]


@pytest.mark.parametrize("interrupt", [RuntimeError("refit broke"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
@pytest.mark.parametrize("steps", [1, 2])
def test_a_failure_or_interrupt_mid_recovery_writes_no_folder(
    interrupt: BaseException, steps: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prunereg_recover.refit import Refit

    build("llama").save_pretrained(tmp_path / "dense")
    before = _files(tmp_path / "dense")
    original = Refit.recover_block
    calls = []

    def fails_in_the_last_round(self: Refit, block: Any) -> str | None:
        calls.append(block.index)
        if len(calls) == 3 * steps - 1:  # the second block of the last round: earlier blocks already written
            raise interrupt
        return original(self, block)

    monkeypatch.setattr(Refit, "recover_block", fails_in_the_last_round)
    with pytest.raises(type(interrupt)):
        prunereg.shrink_folder(
            tmp_path / "dense", tmp_path / "small", "wanda_sp", calibration_ids(), mlp=0.5, steps=steps,
            recover="refit", progress=False,
        )  # fmt: skip
    assert len(calls) == 3 * steps - 1
    assert _files(tmp_path / "dense") == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dense"]  # no output, no staging folder


@pytest.fixture
def llama_folder(tmp_path: Path) -> Path:
    from tests.support.tiny_lm import random_text, save_tiny_llama_folder

    save_tiny_llama_folder(tmp_path / "dense")
    (tmp_path / "calibration.txt").write_text(random_text(200, seed=1))
    return tmp_path


def _shrink_args(folder: Path, output: str, *extra: str) -> list[str]:
    return [
        "shrink", str(folder / "dense"), str(folder / output), "-m", "wanda_sp", "--mlp", "0.5", "--recover", "refit",
        "--calibration", str(folder / "calibration.txt"), "--samples", "4", "--seq-len", "32", *extra,
    ]  # fmt: skip


def test_the_command_streams_recovery_and_writes_what_it_writes_in_memory(llama_folder: Path) -> None:
    streamed = CliRunner().invoke(main, _shrink_args(llama_folder, "streamed", "--stream", "--json"))
    assert streamed.exit_code == 0, streamed.output
    in_memory = CliRunner().invoke(main, _shrink_args(llama_folder, "in_memory", "--json"))
    assert in_memory.exit_code == 0, in_memory.output
    report, expected = json.loads(streamed.stdout), json.loads(in_memory.stdout)
    assert _without_seconds(report) == _without_seconds(expected) and len(report["recovery"]["steps"]) == 2
    _assert_same_weights(
        llama_folder / "streamed",
        transformers.AutoModelForCausalLM.from_pretrained(llama_folder / "in_memory").eval(),
    )
    assert (llama_folder / "streamed" / "tokenizer.json").is_file()


@pytest.mark.slow
def test_the_command_streams_rounds_with_recovery_as_a_real_subprocess(llama_folder: Path) -> None:
    completed = run_prunereg(_shrink_args(llama_folder, "small", "--stream", "--steps", "2"))
    assert completed.returncode == 0, completed.stderr
    assert "in 2 rounds" in completed.stdout and "recovered with refit" in completed.stdout
    in_memory = CliRunner().invoke(main, _shrink_args(llama_folder, "in_memory", "--steps", "2"))
    assert in_memory.exit_code == 0, in_memory.output
    _assert_same_weights(
        llama_folder / "small", transformers.AutoModelForCausalLM.from_pretrained(llama_folder / "in_memory").eval()
    )
    assert sorted(path.name for path in (llama_folder / "small").iterdir() if path.name.startswith(".")) == []


GATED_SECOND_ROUND = """
import os, time
from prunereg._shrink import streaming
from prunereg._cli import main

real = streaming.ShrunkBlocks.done
written = []

def done_then_wait(self, index, block, *, pruned):
    real(self, index, block, pruned=pruned)
    written.append(index)
    if len(written) == 3:  # the first of the two blocks of the second round, recovered and written
        open(os.environ["PRUNEREG_TEST_WRITTEN"], "w").close()
        while not os.path.exists(os.environ["PRUNEREG_TEST_GATE"]):
            time.sleep(0.01)

streaming.ShrunkBlocks.done = done_then_wait
main(prog_name="prunereg")
"""


@pytest.mark.slow
def test_a_termination_signal_in_the_second_round_leaves_no_folder(
    llama_folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import signal

    from tests.support.processes import start_gated, wait_until_marked

    control = tmp_path_factory.mktemp("control")
    before = _files(llama_folder / "dense")
    run = start_gated(GATED_SECOND_ROUND, _shrink_args(llama_folder, "small", "--stream", "--steps", "2"), control)
    try:
        wait_until_marked(run, control, 300, "the gated run never wrote a block of its second round")
        run.send_signal(signal.SIGTERM)
        run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == -signal.SIGTERM
    assert sorted(path.name for path in llama_folder.iterdir()) == ["calibration.txt", "dense"]
    assert _files(llama_folder / "dense") == before
