"""Output files: put in place whole, never over a file that appeared during the run, permissions kept."""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from safetensors.torch import save_file

from prunereg._cli import main
from prunereg._disk.files import AtomicOutputs
from prunereg._disk.paths import TEMPORARY_PREFIX
from prunereg._files import checkpoint as _checkpoint
from prunereg._files.checkpoint import CheckpointError
from tests.support.processes import small_tmpfs


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _write(data: bytes) -> Callable[[str], int]:
    """A writer for :meth:`AtomicOutputs.stage` that writes ``data``."""
    return lambda path: Path(path).write_bytes(data)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("replace", [False, True])
def test_files_appear_only_when_the_block_ends(tmp_path: Path, replace: bool) -> None:
    first, second = tmp_path / "a.bin", tmp_path / "b.bin"
    with AtomicOutputs(replace=replace) as outputs:
        outputs.stage("OUTPUT", first, _write(b"one"))
        outputs.stage("MASKS_FILE", second, _write(b"two"))
        assert not first.exists() and not second.exists()
    assert first.read_bytes() == b"one" and second.read_bytes() == b"two"
    assert _mode(first) == _mode(second) == 0o666 & ~_umask()
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def test_an_error_leaves_nothing_behind(tmp_path: Path) -> None:
    first, second = tmp_path / "a.pt", tmp_path / "b.pt"
    first.write_bytes(b"old")

    def fail(path: str) -> None:
        Path(path).write_bytes(b"partial")
        raise RuntimeError("the method failed")

    with pytest.raises(RuntimeError, match="the method failed"), AtomicOutputs(replace=True) as outputs:
        outputs.stage("OUTPUT", first, _write(b"new"))
        outputs.stage("MASKS_FILE", second, fail)
    assert first.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["a.pt"]


def test_a_file_that_appears_meanwhile_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "out.pt"
    message = re.escape(f"OUTPUT '{target}' exists; pass --force to replace it")
    with pytest.raises(CheckpointError, match=f"^{message}$"), AtomicOutputs(replace=False) as outputs:
        outputs.stage("OUTPUT", target, _write(b"mine"))
        target.write_bytes(b"someone else's")
    assert target.read_bytes() == b"someone else's"
    assert os.listdir(tmp_path) == ["out.pt"]


def test_a_clash_on_the_second_file_takes_the_first_back(tmp_path: Path) -> None:
    output, masks = tmp_path / "out.pt", tmp_path / "masks.safetensors"
    with pytest.raises(CheckpointError, match=r"MASKS_FILE .* exists"), AtomicOutputs(replace=False) as outputs:
        outputs.stage("OUTPUT", output, _write(b"pruned"))
        outputs.stage("MASKS_FILE", masks, _write(b"masks"))
        masks.write_bytes(b"someone else's")
    assert sorted(os.listdir(tmp_path)) == ["masks.safetensors"]
    assert masks.read_bytes() == b"someone else's"


def test_replace_keeps_the_replaced_files_permissions(tmp_path: Path) -> None:
    target = tmp_path / "out.pt"
    target.write_bytes(b"old")
    target.chmod(0o604)
    with AtomicOutputs(replace=True) as outputs:
        outputs.stage("OUTPUT", target, _write(b"new"))
    assert target.read_bytes() == b"new" and _mode(target) == 0o604


def test_the_temporary_name_is_short_and_documented(tmp_path: Path) -> None:
    seen: list[str] = []
    target = tmp_path / ("x" * 252 + ".pt")  # 255 bytes: the longest name most file systems allow
    with AtomicOutputs(replace=False) as outputs:
        outputs.stage("OUTPUT", target, lambda path: (seen.append(path), Path(path).write_bytes(b"data")))
    assert target.read_bytes() == b"data"
    name = Path(seen[0]).name
    assert name.startswith(TEMPORARY_PREFIX) and name.endswith(".tmp") and len(name) < 32
    assert Path(seen[0]).parent == tmp_path


@pytest.mark.parametrize("refusal", [errno.EPERM, errno.EOPNOTSUPP])
def test_without_hard_links_the_target_is_created_exclusively(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: int
) -> None:
    def no_links(*_: object) -> None:
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(os, "link", no_links)
    target = tmp_path / "out.pt"
    with AtomicOutputs(replace=False) as outputs:
        outputs.stage("OUTPUT", target, _write(b"copied"))
    assert target.read_bytes() == b"copied" and os.listdir(tmp_path) == ["out.pt"]
    assert _mode(target) == 0o666 & ~_umask()
    with pytest.raises(CheckpointError, match="exists"), AtomicOutputs(replace=False) as outputs:
        outputs.stage("OUTPUT", target, _write(b"again"))
    assert target.read_bytes() == b"copied" and os.listdir(tmp_path) == ["out.pt"]


def test_a_full_disk_is_named(tmp_path: Path) -> None:
    def full(path: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    target = tmp_path / "out.pt"
    message = re.escape(f"cannot write OUTPUT '{target}': the disk is full")
    with pytest.raises(CheckpointError, match=f"^{message}"), AtomicOutputs(replace=False) as outputs:
        outputs.stage("OUTPUT", target, full)
    assert os.listdir(tmp_path) == []


def _is_character_device(path: str) -> bool:
    return os.path.exists(path) and stat.S_ISCHR(os.stat(path).st_mode)


@pytest.mark.skipif(not _is_character_device("/dev/full"), reason="needs the /dev/full device")
def test_a_full_disk_reaches_the_torch_writer_as_enospc(tmp_path: Path) -> None:
    """Given a path, torch's writer reports a full disk as 'enforce fail at inline_container.cc'; save says ENOSPC."""
    path = tmp_path / "m.pt"
    torch.save({"w": torch.ones(64, 64)}, path)
    with pytest.raises(OSError) as raised:
        _checkpoint.save(_checkpoint.read(path), {}, "/dev/full")
    assert raised.value.errno == errno.ENOSPC


def test_a_full_disk_reaches_the_safetensors_writer_as_enospc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors import SafetensorError
    from safetensors import torch as safetensors_torch

    def full(*_: object, **__: object) -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors_torch, "save_file", full)
    with pytest.raises(OSError) as raised:
        _checkpoint.save_safetensors({"w": torch.ones(2)}, str(tmp_path / "m.safetensors"))
    assert raised.value.errno == errno.ENOSPC


# Through the command line


def _invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="prunereg")


def _model_file(directory: Path) -> Path:
    path = directory / "model.pt"
    torch.save({"w": torch.arange(1.0, 17.0).reshape(4, 4), "b": torch.ones(4)}, path)
    return path


def test_prune_keeps_an_output_that_appeared_during_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, output = _model_file(tmp_path), tmp_path / "out.pt"
    real_save = _checkpoint.save

    def save_while_another_run_finishes(*args: object) -> None:
        real_save(*args)  # type: ignore[arg-type]
        output.write_bytes(b"another run's output")

    monkeypatch.setattr(_checkpoint, "save", save_while_another_run_finishes)
    result = _invoke("prune", path, output, "--method", "l1_unstructured", "--amount", "0.5")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == f"Error: OUTPUT '{output}' exists; pass --force to replace it\n"
    assert output.read_bytes() == b"another run's output"
    assert sorted(os.listdir(tmp_path)) == ["model.pt", "out.pt"]


def test_prune_force_keeps_outputs_permissions(tmp_path: Path) -> None:
    path, output, masks = _model_file(tmp_path), tmp_path / "out.pt", tmp_path / "masks.safetensors"
    output.write_bytes(b"old")
    output.chmod(0o600)
    masks.write_bytes(b"old")
    masks.chmod(0o640)
    result = _invoke(
        "prune", path, output, "--method", "l1_unstructured", "--amount", "0.5", "--masks", masks, "--force"
    )
    assert result.exit_code == 0, result.stderr
    assert _mode(output) == 0o600 and _mode(masks) == 0o640
    assert int((_checkpoint.read(output).tensors["w"] == 0).sum()) == 8


def test_prune_writes_an_output_name_of_255_bytes(tmp_path: Path) -> None:
    path, output = _model_file(tmp_path), tmp_path / ("p" * 252 + ".pt")
    masks = tmp_path / ("m" * 243 + ".safetensors")
    result = _invoke("prune", path, output, "--method", "l1_unstructured", "--amount", "0.5", "--masks", masks)
    assert result.exit_code == 0, result.stderr
    assert sorted(os.listdir(tmp_path)) == sorted(["model.pt", output.name, masks.name])


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB file system (tmpfs), where the privileges allow mounting one."""
    with small_tmpfs(tmp_path / "small", "256k") as mount_point:
        yield mount_point


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_prune_on_a_full_disk_says_so(tmp_path: Path, small_disk: Path, suffix: str) -> None:
    path, output = tmp_path / f"model{suffix}", small_disk / f"out{suffix}"
    tensors = {"w": torch.rand(512, 512)}  # 1 MiB
    torch.save(tensors, path) if suffix == ".pt" else save_file(tensors, path)
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("prunereg")),
            "prune",
            str(path),
            str(output),
            "--method",
            "l1_unstructured",
            "--amount",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"Error: cannot write OUTPUT '{output}': the disk is full (No space left on device)\n"
    assert os.listdir(small_disk) == []


def test_a_directory_refusing_the_temporary_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def read_only(*_: object, **__: object) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    target = tmp_path / "out.pt"
    message = re.escape(f"cannot write OUTPUT '{target}': Permission denied")
    with pytest.raises(CheckpointError, match=message), AtomicOutputs(replace=False) as outputs:
        outputs.stage("OUTPUT", target, _write(b"data"))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit])
def test_an_interruption_inside_torch_save_comes_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interruption: type[BaseException]
) -> None:
    """torch's writer turns a Ctrl-C (or a signal's exception) in a write into 'enforce fail'; save re-raises it."""
    path = tmp_path / "m.pt"
    torch.save({"w": torch.ones(64, 64)}, path)
    checkpoint = _checkpoint.read(path)
    real_open = open

    class Interrupting:
        def __init__(self, handle: object) -> None:
            self.handle, self.writes = handle, 0

        def __getattr__(self, name: str) -> object:
            return getattr(self.handle, name)

        def write(self, data: bytes) -> int:
            self.writes += 1
            if self.writes == 3:
                raise interruption()
            return self.handle.write(data)  # type: ignore[attr-defined, no-any-return]

        def __enter__(self) -> Interrupting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()  # type: ignore[attr-defined]

    monkeypatch.setattr("builtins.open", lambda *args, **kwargs: Interrupting(real_open(*args, **kwargs)))
    with pytest.raises(interruption):
        _checkpoint.save(checkpoint, {}, str(tmp_path / "out.pt"))
