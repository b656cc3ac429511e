"""Model files on disk: read their tensors, write them back with everything else kept.

Two formats: ``.safetensors`` (through the safetensors package, header metadata
kept) and torch files (``.pt``, ``.pth``, ``.bin``, Lightning's ``.ckpt``)
holding a state dict, or a checkpoint dict with the state dict under
``state_dict`` (Lightning's place) or ``model`` (every other entry is carried
over as it was). Only regular files are read; torch
files are read with ``torch.load(weights_only=True)`` only, so loading a file
never runs its pickle, and only after their zip directory shows no zip bomb.
"""

from __future__ import annotations

import copy
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prunereg._disk.errors import CheckpointError, quoted
from prunereg._disk.input_file import open_regular
from prunereg._disk.safetensors_file import open_safetensors
from prunereg._files.archive_check import check_torch_archive
from prunereg._text import describe

SAFETENSORS = "safetensors"
TORCH = "torch"
FORMATS = {".safetensors": SAFETENSORS, ".pt": TORCH, ".pth": TORCH, ".bin": TORCH, ".ckpt": TORCH}
STATE_DICT_KEYS = ("state_dict", "model")


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
        raise CheckpointError(f"unknown format of {quoted(path)}: expected a file ending in {', '.join(FORMATS)}")
    return found


def read(path: Path) -> Checkpoint:
    """Load ``path``'s tensors on the CPU, raising :class:`CheckpointError` for anything unreadable."""
    fmt = file_format(path)
    if fmt == SAFETENSORS:
        return _read_safetensors(path)
    return _read_torch(path)


def _read_safetensors(path: Path) -> Checkpoint:
    from safetensors import SafetensorError

    try:
        with open_safetensors(path, "give the model file itself") as handle:
            metadata = handle.metadata()
            names = handle.offset_keys() if hasattr(handle, "offset_keys") else handle.keys()  # file order, 0.5.3+
            tensors = {name: handle.get_tensor(name) for name in names}
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"cannot read {quoted(path)} as safetensors: {describe(error)}") from error
    return Checkpoint(path, SAFETENSORS, tensors, metadata=metadata)


def _read_torch(path: Path) -> Checkpoint:
    import pickle

    with open_regular(path) as handle:
        check_torch_archive(handle, path)
        try:
            with warnings.catch_warnings():  # a plain pickle is refused below; torch's warning would only repeat it
                warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
                content = torch.load(handle, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            if not str(error).startswith("Weights only load failed"):
                raise CheckpointError(f"cannot read {quoted(path)} as a torch file: {describe(error)}") from error
            raise CheckpointError(
                f"{quoted(path)} holds objects that torch.load(weights_only=True) refuses to load, "
                f"so its pickle was not run: {_refusal_reason(str(error))}"
            ) from error
        except Exception as error:  # torch reports truncated or foreign files with many types
            raise CheckpointError(
                f"cannot read {quoted(path)} as a torch file (truncated or not a torch file?): {describe(error)}"
            ) from error
    if not isinstance(content, Mapping):
        raise CheckpointError(f"{quoted(path)} holds a {type(content).__name__}, not a state dict")
    key = next((k for k in STATE_DICT_KEYS if isinstance(content.get(k), Mapping)), None)
    state = content if key is None else content[key]
    for name, value in state.items():
        if isinstance(value, torch.Tensor) and not isinstance(name, str):
            raise CheckpointError(
                f"{quoted(path)} is not a state dict: a tensor's key is {name!r} ({type(name).__name__}), "
                "where a state dict has parameter names (str)"
            )
    tensors = {name: value for name, value in state.items() if isinstance(value, torch.Tensor)}
    for name, tensor in tensors.items():
        _refuse_more_entries_than_stored(path, name, tensor)
    return Checkpoint(path, TORCH, tensors, content=content, key=key)


def _refuse_more_entries_than_stored(path: Path, name: str, tensor: torch.Tensor) -> None:
    """Refuse a tensor that declares more entries than its storage holds (an expanded, stride-0 view).

    A few bytes stored can declare billions of entries that every computation
    on the tensor would materialize; a state dict saved from a model never
    holds such a view, so the work is bounded by the bytes the file stores.
    """
    if tensor.numel() == 0 or tensor.is_meta:
        return
    declared = tensor.numel() * tensor.element_size()
    stored = tensor.untyped_storage().nbytes()
    if declared > stored:
        shape = "x".join(map(str, tensor.shape))
        raise CheckpointError(
            f"{quoted(path)} is not a state dict a model saved: its tensor {name!r} declares {tensor.numel():,} "
            f"entries ({shape}, strides {tuple(tensor.stride())}) over {stored:,} stored bytes, a view repeating "
            "its data; refusing to compute with it"
        )


def _refusal_reason(message: str) -> str:
    """The line of torch's long weights-only message that names what was refused."""
    advice = ("(1)", "(2)", "Please file an issue", "Check the documentation")
    lines = [line.strip() for line in message.splitlines()[1:] if line.strip()]
    reasons = [line for line in lines if not line.startswith(advice)]
    if not reasons:
        return "see --debug"
    return reasons[0].removeprefix("WeightsUnpickler error: ").split(". Please")[0]


def save(checkpoint: Checkpoint, replaced: Mapping[str, torch.Tensor], path: str) -> None:
    """Write ``checkpoint`` with ``replaced`` tensors to ``path``, in the checkpoint's own format.

    A failed write raises ``OSError`` with the system's reason (a full disk says so).
    """
    content = checkpoint.with_tensors(replaced)
    if checkpoint.format == SAFETENSORS:
        save_safetensors(content, path, checkpoint.metadata)
    else:
        with open(path, "wb") as handle:  # through Python's file: torch's own writer hides the OSError
            try:
                torch.save(content, handle)
            except RuntimeError as error:  # torch's clean-up failed too and reports "enforce fail" instead
                original = _original_failure(error)
                if original is None:
                    raise
                raise original from error


def _original_failure(error: BaseException) -> BaseException | None:
    """What ``error`` was raised while handling: a system error, or an interruption (Ctrl-C, a signal)."""
    seen = error.__context__
    while seen is not None and not isinstance(seen, OSError) and isinstance(seen, Exception):
        seen = seen.__context__
    return seen


def save_safetensors(tensors: Mapping[str, torch.Tensor], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` to ``path`` as safetensors, with header ``metadata``; ``OSError`` if the system refuses."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(dict(tensors), path, metadata=metadata)
    except SafetensorError as error:
        system_error = re.search(r"\(os error (\d+)\)", str(error))
        if system_error is None:
            raise
        code = int(system_error.group(1))
        raise OSError(code, os.strerror(code)) from error
