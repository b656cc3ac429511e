"""Reading a Hugging Face model folder the way transformers does, and nothing outside it.

A model folder is untrusted input. :func:`check_links` refuses a folder holding
a link that leads out of it (``README.md -> ~/.ssh/id_rsa`` would otherwise be
read or copied into the output); the one exception is the Hugging Face cache's
own layout, whose snapshot folders link into the repository's ``blobs/``.
:func:`weight_files` picks the weight files by transformers' rule, so that
every path that reads weights (in memory, streamed, ``prunereg.from_pretrained``)
reads the same ones, and refuses an index naming a file outside the folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from prunereg._text import quoted

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH = "pytorch_model.bin"
PYTORCH_INDEX = "pytorch_model.bin.index.json"


class UnsafeFolderError(ValueError):
    """A model folder asks to read something outside itself."""


def check_links(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> None:
    """Raise :class:`UnsafeFolderError` naming every entry of ``folder`` that is a link leading out of it.

    ``folder`` itself may be a link. Links from a snapshot of the Hugging Face
    cache (``models--org--name/snapshots/REVISION``) into that repository's
    ``blobs/`` count as inside.
    """
    roots = _allowed_roots(Path(folder))
    leaving = []
    with os.scandir(roots[0]) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.is_symlink() and not _is_inside(Path(os.path.realpath(entry.path)), roots):
                leaving.append(f"{entry.name} -> {os.readlink(entry.path)!r}")
    if leaving:
        raise UnsafeFolderError(
            f"{label} {quoted(folder)} holds links that lead out of it ({', '.join(leaving)}); "
            "prunereg reads nothing outside the model folder: copy the files in or remove the links"
        )


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
    explicit = _explicit_weights(root)
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
    from safetensors import safe_open

    weights = weight_files(folder, label)
    if not weights.safetensors:
        raise ValueError(
            f"{label} {quoted(folder)} holds its weights as {weights.files[0].name}; this needs safetensors files"
        )
    if weights.index is not None:
        return _index_map(Path(folder), weights.index, label)
    with safe_open(str(weights.files[0]), framework="pt") as handle:
        return {key: weights.files[0] for key in handle.keys()}  # noqa: SIM118  # safe_open has no __iter__


def _sharded(root: Path, index: Path, label: str) -> WeightFiles:
    files = tuple(dict.fromkeys(_index_map(root, index, label).values()))
    return WeightFiles(files, index, index.name.endswith(".safetensors.index.json"))


def _index_map(root: Path, index: Path, label: str) -> dict[str, Path]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{label}'s {index.name} is not a weight index: {error}") from error
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{label}'s {index.name} is not a weight index: weight_map must map names to file names")
    files = {name: _inside(root, name, label) for name in set(weight_map.values())}
    return {key: files[name] for key, name in weight_map.items()}


def _explicit_weights(root: Path) -> str | None:
    config = root / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # transformers says what is wrong with the config when it reads it
    explicit = data.get("transformers_weights") if isinstance(data, dict) else None
    return explicit if isinstance(explicit, str) else None


def _inside(root: Path, name: str, label: str) -> Path:
    """``root / name``, refused if the name or a link on the way leads out of ``root``."""
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
