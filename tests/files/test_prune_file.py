"""``prunereg.prune_file``: the ``prunereg prune`` workflow as a library function, with the command's promises."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import prunereg
from prunereg._cli import main
from prunereg._files import checkpoint as _checkpoint
from tests.support.checkpoints import (
    CASES,
    LAYOUTS,
    WEIGHTS,
    assert_pruned_as_torch,
    make_model,
    prune_every_builtin_as_torch,
    torch_reference,
    write_checkpoint,
)


def _split(arguments: dict) -> tuple[float | None, dict]:
    rest = dict(arguments)
    return rest.pop("amount", None), rest


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("method", "arguments"), CASES)
def test_prune_file_equals_torch_for_every_builtin(tmp_path: Path, layout: str, method: str, arguments: dict) -> None:
    amount, rest = _split(arguments)

    def run(path: Path, output: Path, masks: Path) -> prunereg.PruneFileReport:
        return prunereg.prune_file(path, output, method, amount=amount, arguments=rest, seed=7, masks=masks)

    report = prune_every_builtin_as_torch(tmp_path, layout, method, arguments, run)
    assert isinstance(report, prunereg.PruneFileReport)
    assert report.pruned == tuple(WEIGHTS) and report.selection.selected == WEIGHTS
    assert report.target.name.startswith("out") and report.masks is not None and not report.dry_run
    pruned = _checkpoint.read(report.target).tensors
    assert report.zeros == sum(int((pruned[name] == 0).sum()) for name in WEIGHTS)
    assert report.numel == sum(pruned[name].numel() for name in WEIGHTS)


@pytest.mark.parametrize("method", ["l1_unstructured", "random_unstructured"])
def test_global_pruning_equals_torch_global_unstructured(tmp_path: Path, method: str) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    output = tmp_path / "out.safetensors"
    prunereg.prune_file(path, output, method, amount=0.45, global_pruning=True, seed=11)
    assert_pruned_as_torch(output, None, torch_reference(method, {"amount": 0.45}, 11, WEIGHTS, together=True), WEIGHTS)


@pytest.mark.parametrize(
    "args",
    [
        ["--method", "l1_unstructured", "--amount", "0.3"],
        ["--method", "ln_structured", "--amount", "0.5", "--arg", "n=2", "--arg", "dim=0", "--exclude", "conv.*"],
        ["--method", "random_unstructured", "--amount", "4", "--global", "--seed", "3"],
        ["--method", "l1_unstructured", "--amount", "0.5", "--include", "fc*", "--dry-run"],
    ],
)
def test_the_command_prints_what_prune_file_returns(tmp_path: Path, args: list[str]) -> None:
    path = write_checkpoint(tmp_path, "state_dict_pt", make_model())
    result = CliRunner().invoke(main, ["prune", str(path), str(tmp_path / "cli.pt"), *args])
    assert result.exit_code == 0, result.stderr

    options: dict = {"arguments": {}}
    for flag, value in zip(args, [*args[1:], None]):
        if flag == "--method":
            method = value
        elif flag == "--amount":
            options["amount"] = float(value) if "." in value else int(value)
        elif flag == "--arg":
            key, _, text = value.partition("=")
            options["arguments"][key] = int(text)
        elif flag in ("--include", "--exclude"):
            options[flag[2:]] = (*options.get(flag[2:], ()), value)
        elif flag == "--seed":
            options["seed"] = int(value)
    options.update(global_pruning="--global" in args, dry_run="--dry-run" in args)
    report = prunereg.prune_file(path, tmp_path / "lib.pt", method, **options)
    assert result.stdout == str(report).replace("lib.pt", "cli.pt") + "\n"
    if not report.dry_run:
        from_cli, from_library = (_checkpoint.read(tmp_path / name).tensors for name in ("cli.pt", "lib.pt"))
        assert from_cli.keys() == from_library.keys()
        assert all(torch.equal(from_cli[name], from_library[name]) for name in from_cli)


def test_a_dry_run_writes_nothing_and_needs_no_target(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    report = prunereg.prune_file(path, None, "l1_unstructured", amount=0.5, dry_run=True)
    assert report.dry_run and report.pruned == () and report.selection.selected == WEIGHTS
    assert str(report).startswith("would prune 3 of 11 tensors with l1_unstructured (dry run: nothing written)")
    assert os.listdir(tmp_path) == [path.name]
    with pytest.raises(ValueError, match="no target given"):
        prunereg.prune_file(path, None, "l1_unstructured", amount=0.5)


def test_the_report_is_data(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    report = prunereg.prune_file(path, tmp_path / "out.safetensors", "l1_unstructured", amount=0.5)
    data = report.as_dict()
    assert data["selected"] == WEIGHTS and data["pruned"] == WEIGHTS
    assert data["skipped"] == {name: "fewer than 2 dimensions" for name in ("conv.bias", "fc1.bias", "fc2.bias")} | {
        "norm.weight": "norm",
        "norm.bias": "norm",
        "norm.running_mean": "norm",
        "norm.running_var": "norm",
        "norm.num_batches_tracked": "not floating point",
    }
    assert data["sparsity"] == pytest.approx(report.zeros / report.numel) and data["target"].endswith("out.safetensors")


# The command's promises, kept by the library: every refusal leaves every file as it was.


def _files(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in os.listdir(directory) if (directory / name).is_file()}


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda p, o: prunereg.prune_file(p, p, "identity", force=True), prunereg.CheckpointError, "is source"),
        (lambda p, o: prunereg.prune_file(p, o, "identity"), prunereg.CheckpointError, "exists; pass force=True"),
        (lambda p, o: prunereg.prune_file(p, o.with_suffix(".pt"), "identity"), prunereg.CheckpointError, "must be"),
        (lambda p, o: prunereg.prune_file(p, o, "nope", force=True), LookupError, "no pruning method named 'nope'"),
        (lambda p, o: prunereg.prune_file(p, o, "l1_unstructured", amount=2.5, force=True), ValueError, "amount"),
        (
            lambda p, o: prunereg.prune_file(p, o, "l1_unstructured", amount=0.5, arguments={"amount": 0.5}),
            ValueError,
            "give the amount once",
        ),
        (
            lambda p, o: prunereg.prune_file(p, o, "l1_unstructured", amount=0.5, include=["x*"], force=True),
            ValueError,
            "no tensor selected",
        ),
        (
            lambda p, o: prunereg.prune_file(p, o, "l1_unstructured", amount=500, force=True),
            ValueError,
            "cannot prune 'conv.weight'",
        ),
    ],
)
def test_refusals_leave_every_file_as_it_was(tmp_path: Path, call, error: type, message: str) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    output = tmp_path / "out.safetensors"
    output.write_bytes(b"someone else's")
    before = _files(tmp_path)
    with pytest.raises(error, match=message):
        call(path, output)
    assert _files(tmp_path) == before


def test_an_output_that_appears_during_the_run_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, output = write_checkpoint(tmp_path, "state_dict_pt", make_model()), tmp_path / "out.pt"
    real_save = _checkpoint.save

    def save_while_another_run_finishes(*args: object) -> None:
        real_save(*args)  # type: ignore[arg-type]
        output.write_bytes(b"another run's output")

    monkeypatch.setattr(_checkpoint, "save", save_while_another_run_finishes)
    with pytest.raises(prunereg.CheckpointError, match="exists; pass force=True to replace it"):
        prunereg.prune_file(path, output, "l1_unstructured", amount=0.5)
    assert output.read_bytes() == b"another run's output"
    assert sorted(os.listdir(tmp_path)) == ["model.pt", "out.pt"]


def test_force_replaces_atomically_and_keeps_the_permissions(tmp_path: Path) -> None:
    path, output = write_checkpoint(tmp_path, "state_dict_pt", make_model()), tmp_path / "out.pt"
    output.write_bytes(b"old")
    output.chmod(0o600)
    prunereg.prune_file(path, output, "l1_unstructured", amount=0.5, force=True)
    assert output.stat().st_mode & 0o777 == 0o600
    assert_pruned_as_torch(output, None, torch_reference("l1_unstructured", {"amount": 0.5}, 0, WEIGHTS), WEIGHTS)


def test_a_failing_write_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_checkpoint(tmp_path, "state_dict_pt", make_model())

    def fail(checkpoint: object, replaced: object, temporary: str) -> None:
        Path(temporary).write_bytes(b"half")
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(_checkpoint, "save", fail)
    with pytest.raises(prunereg.CheckpointError, match="the disk is full"):
        prunereg.prune_file(path, tmp_path / "out.pt", "l1_unstructured", amount=0.5)
    assert os.listdir(tmp_path) == ["model.pt"]


@pytest.mark.slow
def test_sigterm_during_the_write_of_prune_file_removes_the_temporary(tmp_path: Path) -> None:
    """A Python program calling prune_file, killed while it writes: no temporary file, death by SIGTERM."""
    path = write_checkpoint(tmp_path, "state_dict_pt", make_model())
    program = textwrap.dedent(
        f"""
        import os, time
        import prunereg
        from prunereg._files import checkpoint

        real_save = checkpoint.save

        def save_then_wait(*args):
            real_save(*args)
            print("written", flush=True)
            for _ in range(600):  # short sleeps: a signal that reached another of torch's threads is acted on
                time.sleep(0.1)  # by the main thread only when its sleep ends

        checkpoint.save = save_then_wait
        prunereg.prune_file({str(path)!r}, {str(tmp_path / "out.pt")!r}, "l1_unstructured", amount=0.5)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "written\n"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == -signal.SIGTERM
    assert os.listdir(tmp_path) == ["model.pt"]


@settings(max_examples=15, deadline=None)
@given(amount=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_random_amounts_match_torch(tmp_path_factory: pytest.TempPathFactory, amount: float, seed: int) -> None:
    folder = tmp_path_factory.mktemp("amounts")
    path = write_checkpoint(folder, "safetensors", make_model())
    prunereg.prune_file(path, folder / "out.safetensors", "random_unstructured", amount=amount, seed=seed)
    reference = torch_reference("random_unstructured", {"amount": amount}, seed, WEIGHTS)
    assert_pruned_as_torch(folder / "out.safetensors", None, reference, WEIGHTS)
