"""A Hugging Face model folder as one model file: its weight files read together, written back the same way.

``prunereg report`` and ``prunereg prune`` take a folder wherever they take a
file: the folder that ``save_pretrained`` (or ``prunereg oneshot``) wrote, with
one ``model.safetensors`` or an index and its shards (``pytorch_model.bin``
files too). The weight files are the ones transformers reads
(:func:`prunereg._disk.model_dir.weight_files`), each read as a model file
is (regular files only, ``weights_only``, zip checks), and nothing outside the
folder is read: a folder holding a link that leads out of it is refused. A
pruned folder is written with the same files, names and index, and a copy of
every other file of the folder (config, tokenizer, ...).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from prunereg._disk.errors import CheckpointError, quoted
from prunereg._disk.input_file import copy_regular
from prunereg._disk.model_dir import UnsafeFolderError, check_links, read_json, weight_files
from prunereg._files import checkpoint as _checkpoint


@dataclass
class FolderCheckpoint:
    """A model folder's weight files, each a :class:`~prunereg._files.checkpoint.Checkpoint`, and their tensors."""

    path: Path
    files: list[_checkpoint.Checkpoint]
    """The weight files in the order transformers reads them."""
    index: Path | None
    """The index naming the shard of every tensor, if the weights are sharded."""

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of the folder by name, file by file, each file in its own order."""
        return {name: tensor for file in self.files for name, tensor in file.tensors.items()}

    @property
    def format(self) -> str:
        return FOLDER

    def save(self, replaced: Mapping[str, torch.Tensor], staging: Path) -> list[str]:
        """Write the folder into the empty folder ``staging``: every weight file with ``replaced`` swapped in.

        The index and every other regular file at the top of the folder are
        copied as they are; returns the names of the entries left out
        (subfolders, and anything that is not a regular file).
        """
        for file in self.files:
            target = staging / file.path.relative_to(self.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            ours = {name: tensor for name, tensor in replaced.items() if name in file.tensors}
            _checkpoint.save(file, ours, str(target))
        written = {file.path.relative_to(self.path).parts[0] for file in self.files}
        left_out = []
        with os.scandir(self.path) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.name in written:
                    continue
                if stat.S_ISREG(os.stat(entry.path).st_mode):  # links were checked to stay inside
                    copy_regular(Path(entry.path), staging / entry.name, "file of a model folder", "remove it")
                else:
                    left_out.append(entry.name)
        return left_out


FOLDER = "folder"


def read_model(path: Path, label: str = "INPUT") -> _checkpoint.Checkpoint | FolderCheckpoint:
    """The model file or model folder at ``path``, read with all the checks of :func:`read_folder` or ``read``."""
    if path.is_dir():
        return read_folder(path, label)
    return _checkpoint.read(path)


def read_folder(path: Path, label: str = "INPUT") -> FolderCheckpoint:
    """Read the weights of model folder ``path``, raising :class:`CheckpointError` for anything unsafe or unreadable.

    A tensor found in two weight files, or an index naming a tensor its shard
    does not hold, is refused: transformers would load something else than
    what the index says.
    """
    try:
        check_links(path, label)
        weights = weight_files(path, label)
    except (UnsafeFolderError, ValueError, OSError) as error:
        raise CheckpointError(str(error).strip().splitlines()[0]) from error
    files = [_checkpoint.read(file) for file in weights.files]
    seen: dict[str, Path] = {}
    for file in files:
        for name in file.tensors:
            if name in seen:
                raise CheckpointError(
                    f"{label} {quoted(path)} holds tensor {name!r} in both {seen[name].name} and {file.path.name}"
                )
            seen[name] = file.path
    if weights.index is not None:
        _check_index(path, weights.index, seen, label)
    return FolderCheckpoint(path, files, weights.index)


def _check_index(folder: Path, index: Path, found: Mapping[str, Path], label: str) -> None:
    weight_map = read_json(folder, index.relative_to(folder).as_posix(), label)["weight_map"]  # checked already
    for name, file_name in weight_map.items():
        holder = found.get(name)
        if holder is None or os.path.realpath(holder) != os.path.realpath(folder / file_name):
            raise CheckpointError(
                f"{label} {quoted(folder)}: {index.name} puts tensor {name!r} in {file_name}, which does not hold it"
            )
