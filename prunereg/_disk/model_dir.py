"""Reading a Hugging Face model folder the way transformers does, and nothing outside it.

A model folder is untrusted input. :func:`check_links` refuses a folder holding
a link that leads out of it (``README.md -> ~/.ssh/id_rsa`` would otherwise be
read or copied into the output); the one exception is the Hugging Face cache's
own layout, whose snapshot folders link into the repository's ``blobs/``.
:func:`check_model_folder` also refuses, before anything is read, every entry
that is not a regular file or a folder (a FIFO would block whoever opens it,
transformers included, where no signal handler runs), a folder or an oversized
file where transformers reads a file (:data:`LIMITS`). Every file prunereg
itself reads from the folder goes through :mod:`prunereg._disk.input_file`:
:func:`read_json` for the JSON files, :mod:`prunereg._disk.safetensors_file`
for the weights. :func:`weight_files` picks the weight files by transformers'
rule, so that every path that reads weights (in memory, streamed,
``prunereg.from_pretrained``) reads the same ones, and refuses an index naming
a file outside the folder; :func:`weight_headers` gives their tensors' shapes.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prunereg._disk.errors import CheckpointError, size_text
from prunereg._disk.input_file import read_bounded, refuse_unless_regular
from prunereg._disk.safetensors_file import TensorEntry, read_header
from prunereg._text import quoted

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH = "pytorch_model.bin"
PYTORCH_INDEX = "pytorch_model.bin.index.json"
CONFIG_NAME = "config.json"
_TOKENIZER_CONFIG = "tokenizer_config.json"
_FAST_TOKENIZER_FILES = "fast_tokenizer_files"  # its key naming tokenizer files by the transformers version they need
CHAT_TEMPLATES = "additional_chat_templates"
"""The subfolder whose ``*.jinja`` files transformers reads as chat templates."""

CONFIG_FILE, WEIGHT_INDEX, TOKENIZER_FILE = "config file", "weight index", "tokenizer file"
LIMITS = {CONFIG_FILE: 16_000_000, WEIGHT_INDEX: 64_000_000, TOKENIZER_FILE: 512_000_000}
"""The most bytes a file of each kind may hold (the largest of each kind on the Hugging Face Hub is a
fraction of it: configs hold kilobytes, indices of the largest models a few megabytes, ``tokenizer.json``
files up to about 35 MB). A weight file is bounded by its own header instead."""
_KINDS = {
    **dict.fromkeys(
        ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
         "added_tokens.json", "chat_template.json", "chat_template.jinja", "preprocessor_config.json",
         "processor_config.json", "video_preprocessor_config.json", "adapter_config.json"),
        CONFIG_FILE,
    ),
    **dict.fromkeys(
        ("tokenizer.json", "tokenizer.model", "tekken.json", "tiktoken.model", "vocab.json", "vocab.txt",
         "merges.txt", "spiece.model", "sentencepiece.bpe.model"),
        TOKENIZER_FILE,
    ),
}  # fmt: skip
"""The files transformers reads from a folder to build a config, a model or a tokenizer, by kind."""
TOKENIZER_FILES = tuple(name for name, kind in _KINDS.items() if kind == TOKENIZER_FILE)
_WEIGHT_SUFFIXES = (".safetensors", ".bin")


class UnsafeFolderError(ValueError):
    """A model folder asks to read something outside itself."""


def check_links(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> None:
    """Raise :class:`UnsafeFolderError` naming every entry of ``folder`` that is a link leading out of it.

    ``folder`` itself may be a link. Links from a snapshot of the Hugging Face
    cache (``models--org--name/snapshots/REVISION``) into that repository's
    ``blobs/`` count as inside.
    """
    _refuse_links_out(folder, _allowed_roots(Path(folder)), [""], label)


def check_model_folder(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> None:
    """Refuse, before anything in ``folder`` is opened, what reading it as transformers does would trip on.

    :func:`check_links` for the folder and its :data:`CHAT_TEMPLATES`; then
    :class:`CheckpointError` for an entry that is neither a regular file nor a
    folder (a FIFO, a socket, a device), a folder where transformers reads a
    file, and a file larger than :data:`LIMITS` allows its kind. The same for
    the tokenizer files ``tokenizer_config.json`` names (``fast_tokenizer_files``),
    and :class:`UnsafeFolderError` for one of them that leads out of the folder.
    """
    roots = _allowed_roots(Path(folder))
    templates = os.path.join(roots[0], CHAT_TEMPLATES)
    subfolders = [""] + [CHAT_TEMPLATES + "/"] * os.path.isdir(templates)
    _refuse_links_out(folder, roots, subfolders, label)
    for name, path in _entries(roots[0], subfolders):
        kind = kind_of(name) or ("weight file" if name.endswith(_WEIGHT_SUFFIXES) else None)
        _refuse_unreadable(name, Path(path), kind)
    for name in _fast_tokenizer_files(Path(folder), label):
        _refuse_unreadable(name, _inside(Path(folder), name, label), TOKENIZER_FILE)


def _refuse_unreadable(name: str, path: Path, kind: str | None) -> None:
    """Refuse the folder's entry ``name`` at ``path`` unless it is a regular file within its ``kind``'s limit.

    A folder transformers reads no file at (``kind`` None) passes, and so does a
    missing file, a dangling link or a loop: transformers takes them for a
    missing file, as prunereg does.
    """
    try:
        status = os.stat(path)
    except OSError:
        return
    if kind is None and stat.S_ISDIR(status.st_mode):
        return
    hint = replace_hint(name) if kind else "a model folder holds files and folders only: remove it"
    refuse_unless_regular(path, status, kind or "file of a model folder", hint)
    if kind in LIMITS and status.st_size > LIMITS[kind]:
        raise CheckpointError(
            f"{quoted(path)} holds {size_text(status.st_size)}, more than a {kind} can ({size_text(LIMITS[kind])}); "
            f"{hint}"
        )


def _fast_tokenizer_files(folder: Path, label: str) -> list[str]:
    """The files ``tokenizer_config.json``'s ``fast_tokenizer_files`` names: transformers reads one of them.

    They may lie in a subfolder, or name a path out of the folder (``../x/tokenizer.5.0.json``), which
    transformers would read; a ``tokenizer_config.json`` that is not JSON is named when the tokenizer loads.
    """
    if not os.path.lexists(folder / _TOKENIZER_CONFIG):
        return []
    try:
        names = _mapping(read_json(folder, _TOKENIZER_CONFIG, label)).get(_FAST_TOKENIZER_FILES)
    except ValueError:
        return []
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


def kind_of(name: str) -> str | None:
    """The kind of file (a key of :data:`LIMITS`) transformers reads at ``name`` in a folder; None if it reads none."""
    if name.endswith(".index.json"):
        return WEIGHT_INDEX
    if name.startswith(CHAT_TEMPLATES + "/"):
        return CONFIG_FILE if name.endswith(".jinja") else None
    return _KINDS.get(name)


def replace_hint(name: str) -> str:
    """What to do about the folder's file ``name`` that cannot be read: the end of its refusal."""
    return f"replace it with the model's own {name}"


def read_json(folder: str | os.PathLike[str], name: str, label: str = "MODEL_DIR") -> Any:
    """The JSON file ``name`` of ``folder``, read through the checked opener, no larger than its kind allows.

    :class:`UnsafeFolderError` for a name leading out of the folder,
    :class:`CheckpointError` for anything but a regular file or one too large,
    ``ValueError`` for a file that is not JSON.
    """
    kind = kind_of(name) or CONFIG_FILE
    hint = replace_hint(name)
    data = read_bounded(_inside(Path(folder), name, label), LIMITS[kind], kind, hint)
    try:
        return json.loads(data)
    except ValueError as error:  # UnicodeDecodeError included
        raise ValueError(f"{label}'s {name} is not JSON ({error}); {hint}") from error


@dataclass(frozen=True)
class WeightFiles:
    """The weight files transformers loads from a folder: one file, or an index and its shards."""

    files: tuple[Path, ...]
    index: Path | None
    safetensors: bool


def weight_files(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> WeightFiles:
    """The files transformers' ``from_pretrained(folder)`` reads weights from, in its order of preference.

    A file named by ``config.json``'s ``transformers_weights``; else
    ``model.safetensors`` (also when an index is there too); else
    ``model.safetensors.index.json`` and its shards; else ``pytorch_model.bin``
    or its index. ``FileNotFoundError`` when there is none; :class:`UnsafeFolderError`
    when a name leads out of the folder.
    """
    root = Path(folder)
    explicit = _explicit_weights(root, label)
    if explicit is not None:
        path = _inside(root, explicit, label)
        if explicit.endswith(".index.json"):
            return _sharded(root, path, label)
        return WeightFiles((path,), None, explicit.endswith(".safetensors"))
    for name in (SAFETENSORS, SAFETENSORS_INDEX, PYTORCH, PYTORCH_INDEX):
        path = _inside(root, name, label)
        if path.is_file():
            if name.endswith(".index.json"):
                return _sharded(root, path, label)
            return WeightFiles((path,), None, name.endswith(".safetensors"))
    raise FileNotFoundError(
        f"{label} {quoted(folder)} holds no weights ({SAFETENSORS}, {SAFETENSORS_INDEX}, {PYTORCH})"
    )


def safetensors_weight_map(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it, for the files :func:`weight_files` picks."""
    weights = weight_files(folder, label)
    if not weights.safetensors:
        raise ValueError(
            f"{label} {quoted(folder)} holds its weights as {weights.files[0].name}; this needs safetensors files"
        )
    if weights.index is not None:
        return _index_map(Path(folder), weights.index, label)
    return dict.fromkeys(read_header(weights.files[0], replace_hint(weights.files[0].name)), weights.files[0])


@dataclass(frozen=True)
class WeightHeaders:
    """The tensors a folder's safetensors weight files declare, read from their headers alone."""

    tensors: dict[str, TensorEntry]
    files: tuple[Path, ...]

    @property
    def source(self) -> str:
        """The weight files, as a message names them: ``model.safetensors``, ``its 3 weight files``."""
        return self.files[0].name if len(self.files) == 1 else f"its {len(self.files)} weight files"


def weight_headers(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> WeightHeaders | None:
    """The headers of the weight files :func:`weight_files` picks; None when they are not safetensors.

    Each header is read through the checked opener and bounded
    (:func:`prunereg._disk.safetensors_file.read_header`); a tensor declared in
    two files counts once, as the one transformers loads.
    """
    weights = weight_files(folder, label)
    if not weights.safetensors:
        return None
    tensors: dict[str, TensorEntry] = {}
    for file in weights.files:
        tensors.update(read_header(file, replace_hint(file.name)))
    return WeightHeaders(tensors, weights.files)


def _sharded(root: Path, index: Path, label: str) -> WeightFiles:
    files = tuple(dict.fromkeys(_index_map(root, index, label).values()))
    return WeightFiles(files, index, index.name.endswith(".safetensors.index.json"))


def _index_map(root: Path, index: Path, label: str) -> dict[str, Path]:
    weight_map = _mapping(read_json(root, index.relative_to(root).as_posix(), label)).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{label}'s {index.name} is not a weight index: weight_map must map names to file names")
    files = {name: _inside(root, name, label) for name in set(weight_map.values())}
    return {key: files[name] for key, name in weight_map.items()}


def _explicit_weights(root: Path, label: str) -> str | None:
    """The file ``config.json``'s ``transformers_weights`` names, if it can be read (transformers says why not)."""
    if not os.path.lexists(root / CONFIG_NAME):
        return None
    try:
        explicit = _mapping(read_json(root, CONFIG_NAME, label)).get("transformers_weights")
    except ValueError:  # not JSON: transformers says what is wrong with the config when it reads it
        return None
    return explicit if isinstance(explicit, str) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _refuse_links_out(folder: str | os.PathLike[str], roots: list[Path], subfolders: list[str], label: str) -> None:
    """Raise :class:`UnsafeFolderError` naming every entry of the ``subfolders`` of ``roots[0]`` that leads out."""
    leaving = [
        f"{name} -> {os.readlink(path)!r}"
        for name, path in _entries(roots[0], subfolders)
        if os.path.islink(path) and not _is_inside(Path(os.path.realpath(path)), roots)
    ]
    if leaving:
        raise UnsafeFolderError(
            f"{label} {quoted(folder)} holds links that lead out of it ({', '.join(leaving)}); "
            "prunereg reads nothing outside the model folder: copy the files in or remove the links"
        )


def _entries(root: Path, subfolders: list[str]) -> Iterator[tuple[str, str]]:
    """``(name, path)`` of every entry of each of ``root``'s ``subfolders`` (``""``: root itself), by name."""
    for subfolder in subfolders:
        with os.scandir(os.path.join(root, subfolder)) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                yield subfolder + entry.name, entry.path


def _inside(root: Path, name: str, label: str) -> Path:
    """``root / name``, refused if the name or a link on the way leads out of ``root``, or if it holds a NUL."""
    if "\0" in name:  # os.path would raise "embedded null byte", naming neither the folder nor the name
        raise ValueError(f"{label} {quoted(root)} names {name!r}, which is no file name (it holds a NUL character)")
    path = root / name
    if os.path.isabs(name) or not _is_inside(Path(os.path.realpath(path)), _allowed_roots(root)):
        raise UnsafeFolderError(
            f"{label} {quoted(root)} names {name!r}, which leads out of it; prunereg reads nothing outside "
            "the model folder"
        )
    return path


def _allowed_roots(folder: Path) -> list[Path]:
    """The folder (links resolved) and, for a Hugging Face cache snapshot, its repository's ``blobs``."""
    real = Path(os.path.realpath(folder))
    roots = [real]
    snapshots = real.parent
    if snapshots.name == "snapshots" and snapshots.parent.name.startswith(("models--", "datasets--", "spaces--")):
        roots.append(snapshots.parent / "blobs")
    return roots


def _is_inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)
