"""Files of an untrusted model folder: regular files only, opened without blocking, bounded, never outside it."""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from prunereg import CheckpointError
from prunereg._disk.model_dir import (
    LIMITS,
    UnsafeFolderError,
    check_model_folder,
    read_json,
    weight_headers,
)
from prunereg._disk.safetensors_file import MAX_HEADER, open_safetensors, read_header
from tests.support.fifos import fifo_unblocker

HINT = "replace it with the model's own w.safetensors"


def _fifo_refusal(path: Path, name: str | None = None) -> str:
    return f"'{path}' is a FIFO (named pipe), not a regular file; replace it with the model's own {name or path.name}"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A model folder of two shards and an index, a config and a tokenizer file."""
    model = tmp_path / "model"
    model.mkdir()
    save_file({"a.weight": torch.ones(2, 3)}, model / "model-00001-of-00002.safetensors")
    save_file({"b.weight": torch.zeros(4)}, model / "model-00002-of-00002.safetensors")
    index = {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "tokenizer.json").write_text("{}")
    return model


def _as_fifo(path: Path) -> Path:
    if path.exists():
        path.unlink()
    path.parent.mkdir(exist_ok=True)
    os.mkfifo(path)
    return path


def _named_weights(folder: Path, name: str) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "transformers_weights": name}))


# Where prunereg itself opens a file of the folder: each open refuses a FIFO at once (O_NONBLOCK + fstat).
OPENED: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "config.json": ("config.json", lambda folder: read_json(folder, "config.json")),
    "a shard the index names": ("model-00002-of-00002.safetensors", lambda folder: weight_headers(folder)),
    "the weights transformers_weights names": (
        "custom.safetensors",
        lambda folder: (_named_weights(folder, "custom.safetensors"), weight_headers(folder)),
    ),
    "the index transformers_weights names": (
        "custom.safetensors.index.json",
        lambda folder: (_named_weights(folder, "custom.safetensors.index.json"), weight_headers(folder)),
    ),
}


@pytest.mark.parametrize("where", OPENED)
def test_a_fifo_where_prunereg_opens_a_folders_file_is_refused_without_blocking(folder: Path, where: str) -> None:
    name, read = OPENED[where]
    fifo = _as_fifo(folder / name)
    with fifo_unblocker(fifo), pytest.raises(CheckpointError) as refused:
        read(folder)
    assert str(refused.value) == _fifo_refusal(fifo)


def test_the_streamed_reader_opens_each_shard_through_the_checked_opener(folder: Path) -> None:
    from prunereg._runtime.streamed import CheckpointReader

    reader = CheckpointReader(folder)
    assert torch.equal(reader.read(["a.weight"])["a.weight"], torch.ones(2, 3))
    fifo = _as_fifo(folder / "model-00002-of-00002.safetensors")
    with fifo_unblocker(fifo), pytest.raises(CheckpointError) as refused:
        reader.read(["b.weight"])
    assert str(refused.value) == _fifo_refusal(fifo)


# Where transformers opens a file of the folder: refused up front, before it is handed the folder.
@pytest.mark.parametrize(
    "name",
    [
        "config.json", "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "tokenizer.model", "vocab.json",
        "merges.txt", "generation_config.json", "chat_template.jinja", "additional_chat_templates/tool_use.jinja",
    ],
)  # fmt: skip
def test_a_fifo_at_any_name_transformers_reads_is_refused_before_it_reads_any(folder: Path, name: str) -> None:
    fifo = _as_fifo(folder / name)
    with pytest.raises(CheckpointError) as refused:
        check_model_folder(folder)
    assert str(refused.value) == _fifo_refusal(fifo, name)


def test_a_fifo_socket_or_directory_anywhere_transformers_reads_is_named_for_what_it_is(folder: Path) -> None:
    fifo = _as_fifo(folder / "notes.pipe")
    with pytest.raises(CheckpointError) as refused:
        check_model_folder(folder)
    assert str(refused.value) == (
        f"'{fifo}' is a FIFO (named pipe), not a regular file; a model folder holds files and folders only: remove it"
    )
    fifo.unlink()
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(folder / "special_tokens_map.json"))
        with pytest.raises(CheckpointError, match=r"special_tokens_map.json' is a socket, not a regular file; replace"):
            check_model_folder(folder)
    (folder / "special_tokens_map.json").unlink()
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").mkdir()
    with pytest.raises(CheckpointError) as refused:
        check_model_folder(folder)
    assert str(refused.value) == (
        f"'{folder / 'tokenizer.json'}' is a directory, not a tokenizer file; replace it with the model's own "
        "tokenizer.json"
    )


def test_subfolders_and_links_inside_the_folder_are_accepted(folder: Path) -> None:
    (folder / "onnx").mkdir()
    (folder / "original").mkdir()
    os.mkfifo(folder / "original" / "pipe")  # a subfolder transformers does not read is not looked into
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages }}")
    (folder / "tokenizer.json").rename(folder / "original" / "tokenizer.json")
    (folder / "tokenizer.json").symlink_to(folder / "original" / "tokenizer.json")
    (folder / "dangling.txt").symlink_to(folder / "nowhere")
    check_model_folder(folder)


def test_a_link_out_of_the_chat_templates_folder_is_refused(folder: Path, tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("private")
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "a.jinja").symlink_to(tmp_path / "secret")
    with pytest.raises(UnsafeFolderError, match=r"holds links that lead out of it \(additional_chat_templates/a.jinja"):
        check_model_folder(folder)


def _naming_fast_tokenizer_file(folder: Path, name: str) -> None:
    """``tokenizer_config.json`` naming ``name`` as a fast tokenizer file, which transformers then reads."""
    (folder / "tokenizer_config.json").write_text(json.dumps({"fast_tokenizer_files": [name]}))


def test_a_tokenizer_file_the_tokenizer_config_names_is_checked_as_the_folders_own(
    folder: Path, tmp_path: Path
) -> None:
    """transformers read ``fast_tokenizer_files`` wherever it led: out of the folder, through a link, unbounded."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "tokenizer.1.0.json").write_text("{}")
    _naming_fast_tokenizer_file(folder, "../outside/tokenizer.1.0.json")
    with pytest.raises(UnsafeFolderError, match=r"names '../outside/tokenizer.1.0.json', which leads out of it"):
        check_model_folder(folder)
    (folder / "sub").mkdir()
    (folder / "sub" / "tokenizer.1.0.json").symlink_to(tmp_path / "outside" / "tokenizer.1.0.json")
    _naming_fast_tokenizer_file(folder, "sub/tokenizer.1.0.json")
    with pytest.raises(UnsafeFolderError, match=r"names 'sub/tokenizer.1.0.json', which leads out of it"):
        check_model_folder(folder)
    (folder / "sub" / "tokenizer.1.0.json").unlink()
    with open(folder / "sub" / "tokenizer.1.0.json", "wb") as file:
        file.truncate(LIMITS["tokenizer file"] + 1)  # sparse: nothing is written, and nothing may be read
    with pytest.raises(CheckpointError, match=r"tokenizer.1.0.json' holds .*, more than a tokenizer file can"):
        check_model_folder(folder)
    (folder / "sub" / "tokenizer.1.0.json").unlink()
    _as_fifo(folder / "sub" / "tokenizer.1.0.json")
    with pytest.raises(CheckpointError) as refused:
        check_model_folder(folder)
    assert str(refused.value) == _fifo_refusal(folder / "sub" / "tokenizer.1.0.json", "sub/tokenizer.1.0.json")
    (folder / "sub" / "tokenizer.1.0.json").unlink()
    (folder / "sub" / "tokenizer.1.0.json").write_text("{}")
    check_model_folder(folder)  # a file of its own, in a subfolder, is read as transformers reads it


@pytest.mark.parametrize("where", ["fast_tokenizer_files", "an index", "transformers_weights"])
def test_a_name_holding_a_nul_the_folder_gives_is_refused_naming_it(folder: Path, where: str) -> None:
    """os.path raised "embedded null byte", naming neither the folder nor the file that gave the name."""
    name = "model-00002\0.safetensors"
    if where == "fast_tokenizer_files":
        _naming_fast_tokenizer_file(folder, name)
    elif where == "an index":
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        index["weight_map"]["b.weight"] = name
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        _named_weights(folder, name)
    with pytest.raises(ValueError) as refused:
        check_model_folder(folder)
        weight_headers(folder)
    assert str(refused.value) == (
        f"MODEL_DIR '{folder}' names {name!r}, which is no file name (it holds a NUL character)"
    )


@pytest.mark.parametrize(
    ("name", "kind"),
    [("tokenizer_config.json", "config file"), ("model.safetensors.index.json", "weight index"),
     ("tokenizer.json", "tokenizer file")],
)  # fmt: skip
def test_a_file_larger_than_its_kind_can_be_is_refused_unread(folder: Path, name: str, kind: str) -> None:
    path = folder / name
    with open(path, "wb") as file:
        file.truncate(LIMITS[kind] + 1)  # sparse: nothing is written, and nothing may be read
    limit = f"{LIMITS[kind] / 1e6:.1f} MB" if LIMITS[kind] < 1e8 else f"{LIMITS[kind] / 1e9:.2f} GB"
    size = f"{(LIMITS[kind] + 1) / 1e6:.1f} MB" if LIMITS[kind] < 1e8 else f"{(LIMITS[kind] + 1) / 1e9:.2f} GB"
    refusal = f"'{path}' holds {size}, more than a {kind} can ({limit}); replace it with the model's own {name}"
    with pytest.raises(CheckpointError) as refused:
        check_model_folder(folder)
    assert str(refused.value) == refusal
    with pytest.raises(CheckpointError) as refused:
        read_json(folder, name)
    assert str(refused.value) == refusal


def test_a_json_file_that_is_not_json_is_named_in_one_line(folder: Path) -> None:
    (folder / "config.json").write_bytes(b"\xff{not json")
    with pytest.raises(ValueError, match=r"^MODEL_DIR's config.json is not JSON \(.*\); replace it with the model's"):
        read_json(folder, "config.json")


# -- safetensors headers ----------------------------------------------------------------------


def test_headers_give_what_safetensors_reads(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    tensors = {
        "f32": torch.ones(2, 3), "bf16": torch.ones(4, dtype=torch.bfloat16), "f16": torch.ones(1, 1, 2).half(),
        "i8": torch.ones(5, dtype=torch.int8), "bool": torch.ones(3, dtype=torch.bool), "empty": torch.ones(0, 7),
        "scalar": torch.tensor(2.0, dtype=torch.float64), "i64": torch.arange(6).reshape(3, 2),
    }  # fmt: skip
    save_file(tensors, path)
    header = read_header(path, HINT)
    with safe_open(str(path), framework="pt") as handle:
        expected = {name: (handle.get_slice(name).get_dtype(), tuple(handle.get_slice(name).get_shape()))
                    for name in handle.keys()}  # noqa: SIM118  # fmt: skip
    assert {name: (entry.dtype, entry.shape) for name, entry in header.items()} == expected
    with open_safetensors(path, HINT) as handle:
        assert all(torch.equal(handle.get_tensor(name), tensor) for name, tensor in tensors.items())


def _safetensors_bytes(header: object, data: bytes = b"", declared: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return (len(text) if declared is None else declared).to_bytes(8, "little") + text + data


def _with(**changes: object) -> bytes:
    return _safetensors_bytes({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], **changes}}, bytes(8))


BROKEN_HEADERS = {
    "too short": (b"abc", "holds 3 bytes, too few for a safetensors file"),
    "more header than file": (_safetensors_bytes({}, declared=10_000), "declares a header of 10000 bytes"),
    "not json": ((4).to_bytes(8, "little") + b"{{{{", "its header is not JSON"),
    "not an object": (_safetensors_bytes([1, 2]), "its header is not a JSON object"),
    "no dtype": (_with(dtype=None), "has no dtype"),
    "negative size": (_with(shape=[-2]), "not a list of sizes"),
    "offsets outside": (_with(data_offsets=[0, 80]), "lies at bytes 0 to 80 of a data section of 8 bytes"),
    "shape not stored": (_with(shape=[2**40]), "declares shape [1099511627776] of F32 in 8 bytes"),
}


@pytest.mark.parametrize("case", BROKEN_HEADERS)
def test_a_header_that_is_not_safetensors_is_refused(tmp_path: Path, case: str) -> None:
    content, problem = BROKEN_HEADERS[case]
    path = tmp_path / "w.safetensors"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as refused:
        read_header(path, HINT)
    assert problem in str(refused.value) and str(refused.value).endswith(HINT)


def test_a_header_larger_than_safetensors_reads_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    with open(path, "wb") as file:
        file.write((MAX_HEADER + 1).to_bytes(8, "little"))
        file.truncate(MAX_HEADER + 100)  # sparse
    with pytest.raises(CheckpointError, match=r"declares a header of 0.10 GB, more than safetensors reads \(0.10 GB\)"):
        read_header(path, HINT)


def test_a_fifo_never_reaches_safetensors(tmp_path: Path) -> None:
    fifo = _as_fifo(tmp_path / "w.safetensors")
    with fifo_unblocker(fifo), pytest.raises(CheckpointError, match="is a FIFO"), open_safetensors(fifo, HINT):
        pass
    shutil.rmtree(tmp_path)
