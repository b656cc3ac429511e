"""``prunereg prune`` and ``prunereg report`` on checkpoints built here, in process and as real subprocesses."""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from safetensors import safe_open
from safetensors.torch import save_file

from prunereg._cli import main
from prunereg._files import checkpoint
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

SCRIPT = Path(sys.executable).with_name("prunereg")


def cli_arguments(arguments: dict) -> list[str]:
    found = []
    for key, value in arguments.items():
        found += ["--amount", str(value)] if key == "amount" else ["--arg", f"{key}={value}"]
    return found


def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="prunereg")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("method", "arguments"), CASES)
def test_prune_equals_torch_for_every_builtin(tmp_path: Path, layout: str, method: str, arguments: dict) -> None:
    def run(path: Path, output: Path, masks: Path) -> Result:
        return invoke(
            "prune", path, output, "--method", method, *cli_arguments(arguments), "--seed", 7, "--masks", masks
        )

    result = prune_every_builtin_as_torch(tmp_path, layout, method, arguments, run)
    assert isinstance(result, Result) and result.exit_code == 0, result
    assert result.stdout.startswith(f"pruned 3 of {len(make_model().state_dict())} tensors with {method}: ")
    assert result.stderr == ""  # no progress bar off a terminal
    with safe_open(tmp_path / "masks.safetensors", "pt") as handle:
        assert handle.metadata()["prunereg.method"] == method


@pytest.mark.parametrize("layout", LAYOUTS)
def test_everything_around_the_tensors_is_kept(tmp_path: Path, layout: str) -> None:
    path = write_checkpoint(tmp_path, layout, make_model())
    output = tmp_path / f"out{path.suffix}"
    assert invoke("prune", path, output, "--method", "l1_unstructured", "--amount", 0.5).exit_code == 0
    if layout == "safetensors":
        with safe_open(output, "pt") as handle:
            assert handle.metadata() == {"format": "pt", "source": "test"}
        return
    before, after = torch.load(path, weights_only=True), torch.load(output, weights_only=True)
    assert list(after) == list(before)
    state_before = before.get("state_dict", before.get("model", before))
    state_after = after.get("state_dict", after.get("model", after))
    assert list(state_after) == list(state_before)
    assert state_after._metadata == state_before._metadata
    for key in before:
        if key not in ("state_dict", "model") and not isinstance(before[key], torch.Tensor):
            assert after[key] == before[key]
    make_model().load_state_dict(state_after)


@pytest.mark.parametrize("method", ["l1_unstructured", "random_unstructured"])
@pytest.mark.parametrize("amount", ["0.45", "30"])
def test_global_equals_torch_global_unstructured(tmp_path: Path, method: str, amount: str) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    output, masks = tmp_path / "out.safetensors", tmp_path / "masks.safetensors"
    result = invoke(
        "prune", path, output, "--method", method, "--amount", amount, "--global", "--seed", 11, "--masks", masks
    )
    assert result.exit_code == 0, result.stderr
    # safetensors files list tensors by name: conv, fc1, fc2
    reference = torch_reference(
        method, {"amount": float(amount) if "." in amount else int(amount)}, 11, WEIGHTS, together=True
    )
    assert_pruned_as_torch(output, masks, reference, WEIGHTS)


def test_include_replaces_the_defaults_and_exclude_narrows(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, "state_dict_pt", make_model())
    output = tmp_path / "out.pt"
    result = invoke(
        "prune",
        path,
        output,
        "--method",
        "l1_unstructured",
        "--amount",
        0.5,
        "--include",
        "fc*",
        "--include",
        "conv.bias",
        "--exclude",
        "fc2.*",
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("pruned 3 of ")
    names = ["conv.bias", "fc1.weight", "fc1.bias"]  # biases too: an --include names them
    assert_pruned_as_torch(output, None, torch_reference("l1_unstructured", {"amount": 0.5}, 0, names), names)


def test_device(tmp_path: Path, device: str) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    output = tmp_path / "out.safetensors"
    arguments = {"amount": 0.5}
    result = invoke(
        "prune", path, output, "--method", "random_unstructured", "--amount", 0.5, "--seed", 5, "--device", device
    )
    if device == "meta":
        assert result.exit_code == 1 and "cannot prune on the meta device" in result.stderr
        assert not output.exists()
        return
    assert result.exit_code == 0, result.stderr
    reference = torch_reference("random_unstructured", arguments, 5, WEIGHTS, device=device)
    assert_pruned_as_torch(output, None, reference, WEIGHTS)


def test_force_replaces_output(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    output = tmp_path / "out.safetensors"
    output.write_bytes(b"old")
    result = invoke("prune", path, output, "--method", "l1_unstructured", "--amount", 0.2, "--force")
    assert result.exit_code == 0, result.stderr
    assert_pruned_as_torch(output, None, torch_reference("l1_unstructured", {"amount": 0.2}, 0, WEIGHTS), WEIGHTS)
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors", "out.safetensors"]


def test_argument_values_are_parsed_as_numbers() -> None:
    from prunereg._cli.checkpoint import parse_value

    assert [parse_value(v) for v in ["2", "-1", "0.5", "1e-3", "inf", "-inf", "fro", "1.0", ""]] == [
        2,
        -1,
        0.5,
        1e-3,
        math.inf,
        -math.inf,
        "fro",
        1.0,
        "",
    ]
    assert isinstance(parse_value("1.0"), float) and isinstance(parse_value("1"), int)


# Errors: each leaves INPUT byte-identical and no OUTPUT or temporary file behind.


def _input_for(tmp_path: Path, kind: str) -> Path:
    if kind == "safetensors":
        return write_checkpoint(tmp_path, "safetensors", make_model())
    if kind == "pt":
        return write_checkpoint(tmp_path, "checkpoint_state_dict", make_model())
    if kind == "truncated_safetensors":
        path = write_checkpoint(tmp_path, "safetensors", make_model())
    elif kind == "truncated_pt":
        path = write_checkpoint(tmp_path, "state_dict_pt", make_model())
    elif kind == "onnx":
        path = tmp_path / "model.onnx"
        path.write_bytes(b"onnx bytes")
        return path
    elif kind == "plain_pickle":
        path = tmp_path / "plain.pt"
        path.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
        return path
    elif kind == "pickle":
        path = tmp_path / "evil.pt"
        torch.save({"w": torch.ones(2, 2), "run": Payload()}, path)
        return path
    else:
        return tmp_path / "missing.safetensors"
    path.write_bytes(path.read_bytes()[:300])
    return path


class Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pickle code ran",))


ERRORS = [
    ("missing", ["--amount", "0.5"], "'{dir}/missing.safetensors' does not exist"),
    ("truncated_safetensors", ["--amount", "0.5"], "cannot read '{input}' as safetensors: SafetensorError"),
    ("truncated_pt", ["--amount", "0.5"], "cannot read '{input}' as a torch file (truncated or not a torch file?)"),
    ("plain_pickle", ["--amount", "0.5"], "so its pickle was not run: Unsupported operand"),
    (
        "onnx",
        ["--amount", "0.5"],
        "unknown format of '{input}': expected a file ending in .safetensors, .pt, .pth, .bin",
    ),
    (
        "pickle",
        ["--amount", "0.5"],
        "'{input}' holds objects that torch.load(weights_only=True) refuses to load, so its pickle was not run: "
        "Trying to load unsupported GLOBAL posix.system",
    ),
    (
        "safetensors",
        ["--method", "l1_unstuctured"],
        "no pruning method named 'l1_unstuctured'; did you mean 'l1_unstructured'",
    ),
    (
        "safetensors",
        ["--amount", "1.5"],
        "bad arguments for method 'l1_unstructured': "
        "amount=1.5 should either be a float in the range [0, 1] or a non-negative integer",
    ),
    ("safetensors", ["--amount", "-2"], "amount=-2 should either be"),
    ("safetensors", ["--amount", "lots"], "Invalid type for amount: lots"),
    (
        "safetensors",
        ["--amount", "500"],
        "cannot prune 'conv.weight' (shape [4, 3, 2, 2]): ValueError: amount=500 should be smaller",
    ),
    (
        "safetensors",
        ["--amount", "0.5", "--arg", "dim=0"],
        "method 'l1_unstructured' does not take argument 'dim' (it takes: amount)",
    ),
    (
        "pt",
        ["--method", "identity", "--amount", "0.5"],
        "method 'identity' does not take argument 'amount' (it takes: no arguments)",
    ),
    ("pt", ["--method", "ln_structured", "--amount", "0.5"], "method 'ln_structured' needs argument 'n'"),
    ("pt", ["--method", "custom_from_mask"], "method 'custom_from_mask' needs a tensor for argument 'mask'"),
    (
        "pt",
        ["--method", "ln_structured", "--amount", "0.5", "--arg", "n=2", "--global"],
        "global pruning needs an unstructured method; 'ln_structured' is structured",
    ),
    (
        "pt",
        ["--amount", "0.5", "--include", "norm.num*", "--include", "nothing.*"],
        "no tensor selected: of the 11 tensors, 10 not matched by --include, 1 not floating point",
    ),
    ("pt", ["--amount", "0.5", "--device", "meta"], "cannot prune on the meta device"),
    ("pt", ["--amount", "0.5", "--device", "gpu0"], "unknown device 'gpu0'"),
    ("pt", ["--amount", "0.5", "--masks", "{dir}/masks.pt"], "MASKS_FILE '{dir}/masks.pt' must be a safetensors file"),
    ("pt", ["--amount", "0.5", "--masks", "{output}"], "MASKS_FILE '{output}' must be a safetensors file"),
    ("safetensors", ["--amount", "0.5", "--masks", "{output}"], "MASKS_FILE '{output}' is OUTPUT"),
    ("safetensors", ["--amount", "0.5", "--masks", "{input}", "--force"], "MASKS_FILE '{input}' is INPUT"),
]


@pytest.mark.parametrize(("kind", "extra", "message"), ERRORS)
def test_user_errors(tmp_path: Path, kind: str, extra: list[str], message: str) -> None:
    path = _input_for(tmp_path, kind)
    output = tmp_path / f"out{path.suffix}"
    args = [a.format(dir=tmp_path, input=path, output=output) for a in extra]
    if "--method" not in args:
        args = ["--method", "l1_unstructured", *args]
    assert_refused(tmp_path, ["prune", path, output, *args], message.format(dir=tmp_path, input=path, output=output))


def assert_refused(directory: Path, args: list, message: str, *, code: int = 1) -> Result:
    """The command fails with ``code`` and one line naming the problem, changing no file."""
    before = {name: (directory / name).read_bytes() for name in os.listdir(directory) if (directory / name).is_file()}
    result = invoke(*args)
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    if code == 1:
        assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
        assert message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    else:
        assert message in result.stderr, result.stderr
    after = {name: (directory / name).read_bytes() for name in os.listdir(directory) if (directory / name).is_file()}
    assert after == before  # INPUT untouched, no OUTPUT, MASKS_FILE or temporary file
    return result


def test_existing_output_is_refused_without_force(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    output = tmp_path / "out.safetensors"
    output.write_bytes(b"keep me")
    assert_refused(
        tmp_path,
        ["prune", path, output, "--method", "identity"],
        f"OUTPUT '{output}' exists; pass --force to replace it",
    )
    masks = tmp_path / "masks.safetensors"
    masks.write_bytes(b"keep me too")
    assert_refused(
        tmp_path,
        ["prune", path, tmp_path / "new.safetensors", "--method", "identity", "--masks", masks],
        f"MASKS_FILE '{masks}' exists; pass --force to replace it",
    )


@pytest.mark.parametrize("way", ["same", "relative", "symlink", "symlinked_dir", "hardlink"])
def test_output_equal_to_input_is_refused_even_with_force(
    tmp_path: Path, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    if way == "same":
        output = path
    elif way == "relative":
        monkeypatch.chdir(tmp_path)
        output = Path(".") / "sub" / ".." / path.name
        (tmp_path / "sub").mkdir()
    elif way == "symlink":
        output = tmp_path / "link.safetensors"
        output.symlink_to(path)
    elif way == "symlinked_dir":
        (tmp_path / "alias").symlink_to(tmp_path, target_is_directory=True)
        output = tmp_path / "alias" / path.name
    else:
        output = tmp_path / "hard.safetensors"
        os.link(path, output)
    assert_refused(
        tmp_path,
        ["prune", path, output, "--method", "identity", "--force"],
        f"OUTPUT '{output}' is INPUT '{path}'; write the result to another file",
    )


def test_other_output_problems(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    assert_refused(
        tmp_path,
        ["prune", path, tmp_path / "out.pt", "--method", "identity"],
        f"OUTPUT '{tmp_path}/out.pt' must be a safetensors file like INPUT",
    )
    assert_refused(
        tmp_path,
        ["prune", path, tmp_path / "no" / "out.safetensors", "--method", "identity"],
        f"the directory of OUTPUT '{tmp_path}/no/out.safetensors' does not exist",
    )
    (tmp_path / "dir.safetensors").mkdir()
    assert_refused(
        tmp_path,
        ["prune", path, tmp_path / "dir.safetensors", "--method", "identity", "--force"],
        f"OUTPUT '{tmp_path}/dir.safetensors' is a directory",
    )


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    real_save = checkpoint.save_safetensors

    def save_then_fail(tensors: dict, target: str, metadata: dict | None = None) -> None:
        real_save(tensors, target, metadata)
        if all(tensor.dtype == torch.bool for tensor in tensors.values()):  # the masks, written after OUTPUT
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_safetensors", save_then_fail)
    masks = tmp_path / "masks.safetensors"
    assert_refused(
        tmp_path,
        ["prune", path, tmp_path / "out.safetensors", "--method", "identity", "--masks", masks],
        f"cannot write MASKS_FILE '{masks}': the disk is full (No space left on device)",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--amount", "0.5"], "Missing option '--method'"),
        (["--method", "l1_unstructured", "--arg", "amount"], "'amount' is not KEY=VALUE"),
        (["--method", "l1_unstructured", "--arg", "=3"], "'=3' is not KEY=VALUE"),
        (["--method", "ln_structured", "--arg", "n=1", "--arg", "n=2"], "'n' is given twice"),
        (["--method", "l1_unstructured", "--amount", "0.5", "--arg", "amount=0.3"], "give the amount once"),
        (["--method", "l1_unstructured", "--seed", "abc"], "'abc' is not a valid integer"),
        (["--method", "l1_unstructured", "--frobnicate"], "No such option '--frobnicate'"),
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    assert_refused(tmp_path, ["prune", path, tmp_path / "out.safetensors", *args], message, code=2)


def test_missing_output_argument_is_a_usage_error(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    assert_refused(tmp_path, ["prune", path, "--method", "identity"], "Missing argument 'OUTPUT'", code=2)


def test_debug_lets_the_error_through(tmp_path: Path) -> None:
    result = invoke("prune", tmp_path / "missing.pt", tmp_path / "out.pt", "--method", "identity", "--debug")
    assert result.exit_code == 1
    assert isinstance(result.exception, checkpoint.CheckpointError)
    result = invoke("report", tmp_path / "missing.pt", "--debug")
    assert isinstance(result.exception, checkpoint.CheckpointError)


# report


def small_file(directory: Path) -> Path:
    path = directory / "small.safetensors"
    save_file(
        {
            "a.weight": torch.tensor([[0.0, 1.0], [2.0, 0.0]]),
            "b.bias": torch.zeros(3, dtype=torch.float16),
            "step": torch.tensor(5),
        },
        path,
    )
    return path


def test_report_table(tmp_path: Path) -> None:
    result = invoke("report", small_file(tmp_path))
    assert result.exit_code == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    assert rows[0] == ["NAME", "SHAPE", "DTYPE", "NUMEL", "ZEROS", "SPARSITY"]
    assert sorted(rows[1:-1]) == sorted(
        [
            ["a.weight", "2x2", "float32", "4", "2", "50.0%", "[#####.....]"],
            ["b.bias", "3", "float16", "3", "3", "100.0%", "[##########]"],
            ["step", "scalar", "int64", "1", "0", "0.0%", "[..........]"],
        ]
    )
    assert rows[-1] == ["total", "8", "5", "62.5%", "[######....]"]
    assert len({len(line.rstrip()) for line in result.stdout.splitlines()[1:]}) == 1  # aligned columns


def test_report_json(tmp_path: Path) -> None:
    result = invoke("report", small_file(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert list(report) == ["tensors", "total"]
    assert sorted(report["tensors"], key=lambda row: row["name"]) == [
        {
            "name": "a.weight",
            "shape": [2, 2],
            "dtype": "float32",
            "numel": 4,
            "zeros": 2,
            "sparsity": 0.5,
            "pruned_by": [],
        },
        {"name": "b.bias", "shape": [3], "dtype": "float16", "numel": 3, "zeros": 3, "sparsity": 1.0, "pruned_by": []},
        {"name": "step", "shape": [], "dtype": "int64", "numel": 1, "zeros": 0, "sparsity": 0.0, "pruned_by": []},
    ]
    keys = ["name", "shape", "dtype", "numel", "zeros", "sparsity", "pruned_by"]
    assert all(list(row) == keys for row in report["tensors"])
    assert report["total"] == {"numel": 8, "zeros": 5, "sparsity": 0.625}


def test_report_of_a_pruned_checkpoint_dict_and_its_masks(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, "checkpoint_model", make_model())
    output, masks = tmp_path / "out.bin", tmp_path / "masks.safetensors"
    assert (
        invoke("prune", path, output, "--method", "l1_unstructured", "--amount", 0.5, "--masks", masks).exit_code == 0
    )
    report = json.loads(invoke("report", output, "--json").stdout)
    assert [row["name"] for row in report["tensors"]] == list(make_model().state_dict())
    by_name = {row["name"]: row for row in report["tensors"]}
    assert by_name["fc1.weight"]["zeros"] == 36 and by_name["fc1.weight"]["sparsity"] == 0.5
    assert by_name["fc1.bias"]["zeros"] == 0
    mask_report = json.loads(invoke("report", masks, "--json").stdout)
    assert {row["name"]: row["zeros"] for row in mask_report["tensors"]} == {
        "conv.weight": 24,
        "fc1.weight": 36,
        "fc2.weight": 15,
    }


def test_report_errors(tmp_path: Path) -> None:
    assert_refused(tmp_path, ["report", tmp_path / "missing.bin"], f"'{tmp_path}/missing.bin' does not exist")
    truncated = _input_for(tmp_path, "truncated_pt")
    assert_refused(tmp_path, ["report", truncated], f"cannot read '{truncated}' as a torch file")
    assert_refused(tmp_path, ["report"], "Missing argument 'FILE'", code=2)


def test_help_documents_exit_codes() -> None:
    for command in ("prune", "report"):
        result = invoke(command, "--help")
        assert "Exit codes: 0 success, 1 error" in " ".join(result.stdout.split())


# The installed command, as a user runs it.


def run_script(*args: object, **streams: object) -> subprocess.CompletedProcess[str]:
    assert SCRIPT.exists(), f"the prunereg script is not installed next to {sys.executable}"
    if not streams:
        streams = {"capture_output": True}
    return subprocess.run([str(SCRIPT), *map(str, args)], text=True, timeout=120, **streams)


@pytest.mark.slow
def test_subprocess_prune_and_report(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, "checkpoint_state_dict", make_model())
    output, masks = tmp_path / "out.pth", tmp_path / "masks.safetensors"
    arguments = {"amount": 0.5, "n": 1, "dim": 0}
    done = run_script("prune", path, output, "--method", "ln_structured", *cli_arguments(arguments), "--masks", masks)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert_pruned_as_torch(output, masks, torch_reference("ln_structured", arguments, 0, WEIGHTS), WEIGHTS)
    report = run_script("report", output, "--json")
    assert report.returncode == 0, report.stderr
    zeros = {row["name"]: row["zeros"] for row in json.loads(report.stdout)["tensors"]}
    assert [zeros[name] for name in WEIGHTS] == [2 * 12, 3 * 12, 2 * 6]  # half the rows, rounded half to even


@pytest.mark.slow
def test_subprocess_errors_and_exit_codes(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    data = path.read_bytes()
    done = run_script("prune", path, tmp_path / "out.safetensors", "--method", "l1_unstuctured", "--amount", "0.5")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "did you mean 'l1_unstructured'" in done.stderr
    done = run_script("prune", path, tmp_path / "out.safetensors", "--amount", "0.5")
    assert done.returncode == 2 and "Missing option '--method'" in done.stderr
    done = run_script("report", tmp_path / "missing.pt", "--debug")
    assert done.returncode == 1 and "Traceback" in done.stderr and "CheckpointError" in done.stderr
    assert path.read_bytes() == data and os.listdir(tmp_path) == ["model.safetensors"]


@pytest.mark.slow
def test_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    pty = pytest.importorskip("pty")
    path = write_checkpoint(tmp_path, "safetensors", make_model())
    controller, terminal = pty.openpty()
    try:
        done = run_script(
            "prune",
            path,
            tmp_path / "out.safetensors",
            "--method",
            "l1_unstructured",
            "--amount",
            "0.5",
            stderr=terminal,
            stdout=subprocess.PIPE,
        )
        os.close(terminal)
        terminal = -1
        shown = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the terminal's other end is closed: all has been read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(controller)
        if terminal != -1:
            os.close(terminal)
    assert done.returncode == 0
    assert b"pruning with l1_unstructured" in shown
    assert b"pruning with" not in done.stdout.encode()
