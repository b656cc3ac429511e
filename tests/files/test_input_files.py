"""Hostile or odd input files: refused in one line before torch reads them, and never modified."""

from __future__ import annotations

import json
import os
import socket
import struct
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from safetensors.torch import save_file

import prunereg
from prunereg._cli import main
from prunereg._files import archive_check
from prunereg._files import checkpoint as _checkpoint
from prunereg._files.checkpoint import CheckpointError


def _invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="prunereg")


def _assert_one_line_error(result: Result, message: str) -> None:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr == f"Error: {message}\n"


# Non-regular files


@pytest.mark.parametrize("command", ["report", "prune"])
def test_a_fifo_is_refused_without_blocking(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "model.pt"
    os.mkfifo(fifo)
    args = ["prune", fifo, tmp_path / "out.pt", "--method", "identity"] if command == "prune" else ["report", fifo]
    _assert_one_line_error(
        _invoke(*args), f"'{fifo}' is a FIFO (named pipe), not a regular file; give the model file itself"
    )
    assert os.listdir(tmp_path) == ["model.pt"]


def test_a_socket_and_a_device_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(CheckpointError, match="is a socket, not a regular file"):
            _checkpoint.read(path)
    device = tmp_path / "zero.pt"
    device.symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match="is a character device, not a regular file"):
        _checkpoint.read(device)


def test_a_symlink_loop_is_named(tmp_path: Path) -> None:
    (tmp_path / "a.pt").symlink_to(tmp_path / "b.pt")
    (tmp_path / "b.pt").symlink_to(tmp_path / "a.pt")
    loop = tmp_path / "a.pt"
    _assert_one_line_error(_invoke("report", loop), f"'{loop}' is a symlink loop: following it never reaches a file")
    _assert_one_line_error(
        _invoke("prune", loop, tmp_path / "out.pt", "--method", "identity"),
        f"'{loop}' is a symlink loop: following it never reaches a file",
    )


def test_a_dangling_symlink_names_its_target(tmp_path: Path) -> None:
    link = tmp_path / "m.safetensors"
    link.symlink_to("gone.safetensors")
    _assert_one_line_error(
        _invoke("report", link), f"'{link}' is a symlink to 'gone.safetensors', which does not exist"
    )


def test_an_output_directory_in_a_symlink_loop_is_named(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    torch.save({"w": torch.ones(2, 2)}, path)
    (tmp_path / "d1").symlink_to(tmp_path / "d2")
    (tmp_path / "d2").symlink_to(tmp_path / "d1")
    output = tmp_path / "d1" / "out.pt"
    _assert_one_line_error(
        _invoke("prune", path, output, "--method", "identity"), f"the directory of OUTPUT '{output}' is a symlink loop"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    torch.save({"w": torch.ones(2, 2)}, path)
    path.chmod(0)
    _assert_one_line_error(_invoke("report", path), f"cannot read '{path}': permission denied")


@pytest.mark.parametrize("name", ["new\nline.pt", "carriage\rreturn.safetensors", "tab\tand 'quote'.pt"])
def test_a_path_with_control_characters_stays_on_one_line(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    result = _invoke("report", path)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert result.stderr == f"Error: {str(path)!r} does not exist\n"
    assert name.encode("unicode_escape").decode() in result.stderr


# Torch archives that torch.save cannot have written


def _rezipped(path: Path, compression: int) -> None:
    """Rewrite the torch file at ``path`` with every entry compressed (torch.save stores them)."""
    with zipfile.ZipFile(path) as original:
        entries = [(info.filename, original.read(info)) for info in original.infolist()]
    with zipfile.ZipFile(path, "w", compression=compression) as rezipped:
        for name, data in entries:
            rezipped.writestr(name, data)


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_a_zip_bomb_is_refused_unread(tmp_path: Path, compression: int, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bomb.pt"
    torch.save({"w": torch.zeros(4, 2**20)}, path)  # 16 MiB of zeros
    _rezipped(path, compression)
    assert path.stat().st_size < 2**20 // 4
    loaded: list[object] = []
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: loaded.append(args))
    name = {zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}[compression]
    _assert_one_line_error(
        _invoke("report", path),
        f"'{path}' is not a torch file: its entry 'bomb/data.pkl' is compressed ({name}), "
        "which torch.save never does; refusing to inflate it",
    )
    assert loaded == []


def _patch_central_directory(path: Path, entry_name: str, uncompressed: int) -> None:
    """Make the zip directory of ``path`` declare ``uncompressed`` bytes for ``entry_name``."""
    data = bytearray(path.read_bytes())
    at = data.index(b"PK\x01\x02")  # the first entry of the central directory
    while True:
        name_length = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46 : at + 46 + name_length].decode() == entry_name:
            struct.pack_into("<I", data, at + 24, uncompressed)
            path.write_bytes(bytes(data))
            return
        extra, comment = struct.unpack_from("<HH", data, at + 30)
        at += 46 + name_length + extra + comment


def test_an_archive_declaring_more_than_it_holds_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "liar.pt"
    torch.save({"w": torch.ones(4, 4)}, path)
    _patch_central_directory(path, "liar/data/0", 2**31)
    with pytest.raises(CheckpointError, match="its entry 'liar/data/0' declares more bytes than the file holds"):
        _checkpoint.read(path)


def test_an_archive_declaring_more_than_the_memory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.pt"
    torch.save({"w": torch.ones(256, 1024)}, path)  # 1 MiB
    monkeypatch.setattr(archive_check, "physical_memory", lambda: 2**19)
    message = r"declares 1\.0 MiB of data, more than this machine's 0\.5 MiB of memory"
    with pytest.raises(CheckpointError, match=message):
        _checkpoint.read(path)
    monkeypatch.setattr(archive_check, "physical_memory", lambda: 2**21)
    assert torch.equal(_checkpoint.read(path).tensors["w"], torch.ones(256, 1024))


def _with_a_malformed_extra_field(path: Path) -> None:
    """Give the first entry of the zip directory of ``path`` an extra field that Python's zipfile cannot parse.

    The field declares 16 bytes and holds 4; torch's reader skips it and reads the archive anyway.
    """
    data = path.read_bytes()
    end = data.rindex(b"PK\x05\x06")
    directory_size, directory_offset = struct.unpack_from("<II", data, end + 12)
    name_length, extra_length = struct.unpack_from("<HH", data, directory_offset + 28)
    assert extra_length == 0
    malformed = struct.pack("<HH", 0x0001, 16) + bytes(4)
    entry = bytearray(data[directory_offset : directory_offset + 46 + name_length])
    struct.pack_into("<H", entry, 30, len(malformed))
    patched = bytearray(data[:directory_offset] + entry + malformed + data[directory_offset + 46 + name_length :])
    struct.pack_into("<I", patched, patched.rindex(b"PK\x05\x06") + 12, directory_size + len(malformed))
    path.write_bytes(bytes(patched))


@pytest.mark.parametrize("command", ["report", "prune"])
def test_a_zip_bomb_whose_directory_python_cannot_read_is_refused_unread(tmp_path: Path, command: str) -> None:
    """Issue 20, item 9: the size check was skipped when zipfile failed, and torch inflated the bomb."""
    path = tmp_path / "bomb.pt"
    torch.save({"w": torch.zeros(4, 2**20)}, path)  # 16 MiB of zeros
    _rezipped(path, zipfile.ZIP_DEFLATED)
    _with_a_malformed_extra_field(path)
    assert path.stat().st_size < 2**16
    assert torch.load(path, weights_only=True)["w"].shape == (4, 2**20)  # what torch alone would do
    args = ["prune", path, tmp_path / "out.pt", "--method", "identity"] if command == "prune" else ["report", path]
    _assert_one_line_error(
        _invoke(*args),
        f"cannot read '{path}' as a torch file (truncated or not a torch file?): its zip directory cannot be read "
        "(BadZipFile: Corrupt extra field 0001 (size=16)), so the sizes of its entries cannot be checked; "
        "refusing to load it",
    )
    assert os.listdir(tmp_path) == ["bomb.pt"]


@pytest.mark.parametrize("command", ["report", "prune"])
def test_a_tensor_declaring_more_entries_than_it_stores_is_refused(tmp_path: Path, command: str) -> None:
    """Issue 20, item 10: a stride-0 view of 4 bytes declaring 16 M entries (the issue's was 2.6 GB from 1.5 KB)."""
    path = tmp_path / "expanded.pt"
    torch.save({"layer.weight": torch.zeros(1).expand(4096, 4096), "other.weight": torch.ones(4, 4)}, path)
    assert path.stat().st_size < 4096
    args = ["prune", path, tmp_path / "out.pt", "--method", "identity"] if command == "prune" else ["report", path]
    _assert_one_line_error(
        _invoke(*args),
        f"'{path}' is not a state dict a model saved: its tensor 'layer.weight' declares 16,777,216 entries "
        "(4096x4096, strides (0, 0)) over 4 stored bytes, a view repeating its data; refusing to compute with it",
    )
    assert os.listdir(tmp_path) == ["expanded.pt"]


def test_report_counts_a_tensor_stored_under_many_names_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One stored tensor under a thousand names costs one count, not a thousand: the work follows the bytes stored."""
    from prunereg._models import summary as _summary

    weight = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    path = tmp_path / "many.pt"
    torch.save({f"layer{index}.weight": weight for index in range(1000)}, path)
    counted: list[str] = []
    real = _summary.tensor_summary

    def counting(name: str, *args: object, **kwargs: object) -> _summary.TensorSummary:
        counted.append(name)
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_summary, "tensor_summary", counting)
    result = _invoke("report", path, "--json")
    assert result.exit_code == 0, result.stderr
    assert counted == ["layer0.weight"]
    report = json.loads(result.stdout)
    assert [row["name"] for row in report["tensors"]] == [f"layer{index}.weight" for index in range(1000)]
    assert {row["zeros"] for row in report["tensors"]} == {2} and report["total"]["zeros"] == 2000


def test_views_within_their_storage_are_read(tmp_path: Path) -> None:
    """Slices, transposes and tied names address no more than their storage holds: they are read as they are."""
    base = torch.arange(12.0).reshape(3, 4)
    path = tmp_path / "views.pt"
    torch.save({"base": base, "slice": base[:, :2], "transposed": base.t(), "tied": base}, path)
    tensors = _checkpoint.read(path).tensors
    assert torch.equal(tensors["slice"], base[:, :2]) and torch.equal(tensors["transposed"], base.t())


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_a_torchscript_archive_is_refused_without_torchs_warning(tmp_path: Path) -> None:
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _invoke("report", path)
    assert caught == []
    _assert_one_line_error(
        result,
        f"'{path}' is a TorchScript archive, not a state dict: "
        "save its state_dict() with torch.save, or export it to safetensors",
    )


def test_warnings_are_shown_after_a_command_that_succeeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.pt"
    torch.save({"w": torch.ones(2, 2)}, path)
    real_load = torch.load

    def load_with_a_warning(*args: object, **kwargs: object) -> object:
        warnings.warn("a torch remark", UserWarning, stacklevel=2)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", load_with_a_warning)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _invoke("report", path)
    assert result.exit_code == 0, result.stderr
    assert [str(warning.message) for warning in caught] == ["a torch remark"]


def test_plugin_warnings_are_shown_even_when_the_command_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.pt"
    torch.save({"w": torch.ones(2, 2)}, path)

    def fail_after_a_plugin_warning(*_: object, **__: object) -> None:
        warnings.warn("plugin 'x' failed to load", prunereg.PluginWarning, stacklevel=2)
        warnings.warn("torch noise", UserWarning, stacklevel=2)
        raise RuntimeError("cannot load")

    monkeypatch.setattr(torch, "load", fail_after_a_plugin_warning)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _invoke("report", path)
    assert result.exit_code == 1
    assert [str(warning.message) for warning in caught] == ["plugin 'x' failed to load"]


def test_torchs_warnings_are_dropped_when_the_load_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.pt"
    torch.save({"w": torch.ones(2, 2)}, path)

    def warn_then_fail(*_: object, **__: object) -> None:
        warnings.warn("noise before the failure", UserWarning, stacklevel=2)
        raise RuntimeError("cannot load")

    monkeypatch.setattr(torch, "load", warn_then_fail)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _invoke("report", path)
    assert caught == []
    _assert_one_line_error(
        result, f"cannot read '{path}' as a torch file (truncated or not a torch file?): RuntimeError: cannot load"
    )


# State dicts with keys that are no names


@pytest.mark.parametrize("key", [0, (1, 2), None, 1.5])
def test_report_refuses_tensors_keyed_by_non_strings(tmp_path: Path, key: object) -> None:
    path = tmp_path / "odd.pt"
    torch.save({"ok": torch.ones(2), key: torch.zeros(2, 2)}, path)
    _assert_one_line_error(
        _invoke("report", path),
        f"'{path}' is not a state dict: a tensor's key is {key!r} ({type(key).__name__}), "
        "where a state dict has parameter names (str)",
    )


def test_non_string_keys_of_other_values_are_carried_over(tmp_path: Path) -> None:
    path, out = tmp_path / "c.pt", tmp_path / "o.pt"
    torch.save({"w": torch.ones(2, 2), 3: "three", None: [1]}, path)
    checkpoint = _checkpoint.read(path)
    assert list(checkpoint.tensors) == ["w"]
    _checkpoint.save(checkpoint, {"w": torch.zeros(2, 2)}, str(out))
    assert torch.load(out, weights_only=True)[3] == "three"


def test_safetensors_inputs_are_checked_too(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(2, 2)}, path)
    os.mkfifo(tmp_path / "p.safetensors")
    with pytest.raises(CheckpointError, match="is a FIFO"):
        _checkpoint.read(tmp_path / "p.safetensors")
    assert list(_checkpoint.read(path).tensors) == ["w"]
