"""Model files on disk: read their tensors, write them back with everything else kept.

Two formats: ``.safetensors`` (through the safetensors package, header metadata
kept) and torch files (``.pt``, ``.pth``, ``.bin``) holding a state dict, or a
checkpoint dict with the state dict under ``state_dict`` or ``model`` (every
other entry is carried over as it was). Torch files are read with
``torch.load(weights_only=True)`` only, so loading a file never runs its pickle.
Files are written to a temporary file beside the target and renamed into place.
"""

from __future__ import annotations

import copy
import os
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SAFETENSORS = "safetensors"
TORCH = "torch"
FORMATS = {".safetensors": SAFETENSORS, ".pt": TORCH, ".pth": TORCH, ".bin": TORCH}
STATE_DICT_KEYS = ("state_dict", "model")


class CheckpointError(Exception):
    """A model file cannot be read or written: missing, truncated, of unknown format, unsafe."""


@dataclass
class Checkpoint:
    """A model file's tensors by name, in file order, and what surrounds them in the file."""

    path: Path
    format: str
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str] | None = None
    """safetensors: the header's ``__metadata__``."""
    content: Any = None
    """torch: the whole object that was loaded."""
    key: str | None = None
    """torch: where the state dict sits in ``content`` (``None``: it is ``content``)."""

    def with_tensors(self, replaced: Mapping[str, torch.Tensor]) -> Any:
        """The file's content with ``replaced`` tensors swapped in, in place and order."""
        if self.format == SAFETENSORS:
            return {**self.tensors, **replaced}
        state = copy.copy(self._state())  # a shallow copy keeps OrderedDict and its _metadata
        state.update(replaced)
        if self.key is None:
            return state
        content = copy.copy(self.content)
        content[self.key] = state
        return content

    def _state(self) -> Any:
        return self.content if self.key is None else self.content[self.key]


def file_format(path: Path) -> str:
    """``"safetensors"`` or ``"torch"``, from the file name's suffix."""
    found = FORMATS.get(path.suffix.lower())
    if found is None:
        raise CheckpointError(
            f"unknown format of '{path}': expected a file ending in {', '.join(FORMATS)}"
        )
    return found


def read(path: Path) -> Checkpoint:
    """Load ``path``'s tensors on the CPU, raising :class:`CheckpointError` for anything unreadable."""
    fmt = file_format(path)
    if not path.exists():
        raise CheckpointError(f"'{path}' does not exist")
    if path.is_dir():
        raise CheckpointError(f"'{path}' is a directory, not a model file")
    if fmt == SAFETENSORS:
        return _read_safetensors(path)
    return _read_torch(path)


def _read_safetensors(path: Path) -> Checkpoint:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt", device="cpu") as handle:
            metadata = handle.metadata()
            names = handle.offset_keys() if hasattr(handle, "offset_keys") else handle.keys()  # file order, 0.5.3+
            tensors = {name: handle.get_tensor(name) for name in names}
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"cannot read '{path}' as safetensors: {describe(error)}") from error
    return Checkpoint(path, SAFETENSORS, tensors, metadata=metadata)


def _read_torch(path: Path) -> Checkpoint:
    import pickle

    try:
        with warnings.catch_warnings():  # a plain pickle is refused below; torch's warning would only repeat it
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            content = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if not str(error).startswith("Weights only load failed"):
            raise CheckpointError(f"cannot read '{path}' as a torch file: {describe(error)}") from error
        raise CheckpointError(
            f"'{path}' holds objects that torch.load(weights_only=True) refuses to load, "
            f"so its pickle was not run: {_refusal_reason(str(error))}"
        ) from error
    except Exception as error:  # torch reports truncated or foreign files with many types
        raise CheckpointError(
            f"cannot read '{path}' as a torch file (truncated or not a torch file?): {describe(error)}"
        ) from error
    if not isinstance(content, Mapping):
        raise CheckpointError(f"'{path}' holds a {type(content).__name__}, not a state dict")
    key = next((k for k in STATE_DICT_KEYS if isinstance(content.get(k), Mapping)), None)
    state = content if key is None else content[key]
    tensors = {name: value for name, value in state.items() if isinstance(value, torch.Tensor)}
    return Checkpoint(path, TORCH, tensors, content=content, key=key)


def _refusal_reason(message: str) -> str:
    """The line of torch's long weights-only message that names what was refused."""
    advice = ("(1)", "(2)", "Please file an issue", "Check the documentation")
    lines = [line.strip() for line in message.splitlines()[1:] if line.strip()]
    reasons = [line for line in lines if not line.startswith(advice)]
    if not reasons:
        return "see --debug"
    return reasons[0].removeprefix("WeightsUnpickler error: ").split(". Please")[0]


def describe(error: BaseException) -> str:
    """``Type: first sentence of the message``: an error in one line, for messages that must stay short."""
    lines = str(error).strip().splitlines()
    if not lines:
        return type(error).__name__
    sentence_end = lines[0].find(". ")
    first = lines[0] if sentence_end == -1 else lines[0][: sentence_end + 1]
    return f"{type(error).__name__}: {first}"


def save(checkpoint: Checkpoint, replaced: Mapping[str, torch.Tensor], path: str) -> None:
    """Write ``checkpoint`` with ``replaced`` tensors to ``path``, in the checkpoint's own format."""
    content = checkpoint.with_tensors(replaced)
    if checkpoint.format == SAFETENSORS:
        save_safetensors(content, path, checkpoint.metadata)
    else:
        torch.save(content, path)


def save_safetensors(tensors: Mapping[str, torch.Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` to ``path`` as safetensors, with header ``metadata``."""
    from safetensors.torch import save_file

    save_file(dict(tensors), path, metadata=metadata)


class AtomicWrites:
    """Files written beside their targets under temporary names, renamed into place together.

    Used as a context manager: :meth:`stage` writes each file; leaving the block
    normally renames them all into place, leaving it by an exception deletes
    them, so a target is either the old file or the complete new one.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[str, Path]] = []

    def stage(self, target: Path, write: Callable[[str], None]) -> None:
        """Run ``write(temporary_path)`` for the file that will become ``target``."""
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        self._staged.append((temporary, target))
        write(temporary)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())

    def __enter__(self) -> AtomicWrites:
        return self

    def __exit__(self, error_type: type[BaseException] | None, *_: object) -> None:
        try:
            if error_type is None:
                mode = 0o666 & ~_umask()
                for temporary, target in self._staged:
                    os.chmod(temporary, mode)
                    os.replace(temporary, target)
        finally:
            for temporary, _target in self._staged:
                if os.path.exists(temporary):
                    os.unlink(temporary)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
