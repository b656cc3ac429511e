"""A safetensors file read through the checked opener: its header alone, bounded, or its tensors by name.

:func:`read_header` reads what a model folder's config is checked against
without safetensors and without the tensors: the 8-byte little-endian length,
then that many bytes of JSON, refused when the length is more than the file
holds or more than safetensors itself allows (100 MB). Every entry must name a
dtype, a shape of non-negative integers and data offsets inside the file that
hold exactly the shape's bytes (for the dtypes of whole bytes), so the shapes
it gives are shapes the file really stores.

:func:`open_safetensors` is ``safetensors.safe_open`` on the file
:func:`~prunereg._disk.input_file.open_regular` checked (a regular file, opened
without blocking), never on a name that may have been swapped for a FIFO since.

:class:`SafetensorsWriter` writes a file one tensor at a time (``prunereg
slim --stream``), the bytes ``save_file`` writes of the same tensors.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prunereg._bytes import tensor_buffer
from prunereg._disk.errors import CheckpointError, quoted, size_text
from prunereg._disk.input_file import open_regular, reopenable_path

MAX_HEADER = 100_000_000
"""The most bytes of header safetensors itself reads (its ``MAX_HEADER_SIZE``)."""

_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8, "C64": 8,
}  # fmt: skip
"""Bytes per entry of the dtypes of whole bytes (the sub-byte ones, F4 and F6, are not checked for size)."""
_WHAT = "safetensors file"


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a safetensors header declares it."""

    dtype: str
    shape: tuple[int, ...]


def read_header(path: Path, hint: str) -> dict[str, TensorEntry]:
    """The tensors ``path``'s header declares, by name; :class:`CheckpointError` if the file is not safetensors.

    ``hint`` ends a refusal with what to do.
    """
    with open_regular(path, _WHAT, hint) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < 8:
            raise CheckpointError(f"{quoted(path)} holds {size} bytes, too few for a {_WHAT}; {hint}")
        length = int.from_bytes(handle.read(8), "little")
        if length > size - 8:
            raise CheckpointError(
                f"{quoted(path)} is not a {_WHAT}: it declares a header of {length} bytes and holds {size}; {hint}"
            )
        if length > MAX_HEADER:
            raise CheckpointError(
                f"{quoted(path)} declares a header of {size_text(length)}, more than safetensors reads "
                f"({size_text(MAX_HEADER)}); {hint}"
            )
        text = handle.read(length)
    try:
        header = json.loads(text)
    except ValueError as error:
        raise CheckpointError(f"{quoted(path)} is not a {_WHAT}: its header is not JSON ({error}); {hint}") from error
    if not isinstance(header, dict):
        raise CheckpointError(f"{quoted(path)} is not a {_WHAT}: its header is not a JSON object; {hint}")
    data_size = size - 8 - length
    entries = {}
    for name, entry in header.items():
        if name != "__metadata__":
            problem = _problem(entry, data_size)
            if problem is not None:
                raise CheckpointError(f"{quoted(path)} is not a {_WHAT}: tensor {name!r} {problem}; {hint}")
            entries[name] = TensorEntry(entry["dtype"], tuple(entry["shape"]))
    return entries


@contextlib.contextmanager
def open_safetensors(path: Path, hint: str) -> Iterator[Any]:
    """``safetensors.safe_open`` (torch tensors on the CPU) on ``path``, once it is found to be a regular file."""
    from safetensors import safe_open

    with (
        open_regular(path, _WHAT, hint) as checked,
        safe_open(reopenable_path(checked, path), framework="pt") as handle,
    ):
        yield handle


def _problem(entry: object, data_size: int) -> str | None:
    """What is wrong with one header entry, or None."""
    if not isinstance(entry, dict):
        return "is not described by a JSON object"
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        return "has no dtype"
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        return f"has shape {shape!r}, not a list of sizes"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        return f"has data offsets {offsets!r}, not [begin, end]"
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        return f"lies at bytes {begin} to {end} of a data section of {data_size} bytes"
    if dtype in _BYTES and (end - begin) != math.prod(shape) * _BYTES[dtype]:
        return f"declares shape {shape} of {dtype} in {end - begin} bytes"
    return None


DTYPE_CODES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}  # fmt: skip
"""safetensors' name of each torch dtype a model folder holds (``torch.float32`` -> ``F32``)."""
_RANKS = {code: rank for rank, code in enumerate((
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16", "I32",
    "U32", "F32", "C64", "F64", "I64", "U64",
))}  # fmt: skip
"""safetensors' order of its dtypes: ``save_file`` lays tensors out from the last down, then by name."""


class SafetensorsWriter:
    """A safetensors file written one tensor at a time, so that no more than one tensor is ever in memory.

    The header is written first, from the names, dtypes and shapes to come
    (``entries``), laid out as ``safetensors.torch.save_file`` lays it out
    (tensors in safetensors' dtype order, then by name; the JSON padded with spaces
    to 8 bytes): the file is the one ``save_file`` writes of the same tensors.
    :attr:`order` is the order :meth:`write` takes them in. A context manager:
    the file is closed on leaving it.
    """

    def __init__(self, path: Path, entries: dict[str, tuple[Any, tuple[int, ...]]], metadata: dict[str, str]) -> None:
        codes = {name: DTYPE_CODES[str(dtype).removeprefix("torch.")] for name, (dtype, _) in entries.items()}
        self.order = sorted(entries, key=lambda name: (-_RANKS[codes[name]], name))
        self._shapes = {name: tuple(shape) for name, (_, shape) in entries.items()}
        self._dtypes = {name: dtype for name, (dtype, _) in entries.items()}
        header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
        offset = 0
        for name in self.order:
            size = math.prod(self._shapes[name]) * _BYTES[codes[name]]
            header[name] = {
                "dtype": codes[name],
                "shape": list(self._shapes[name]),
                "data_offsets": [offset, offset + size],
            }
            offset += size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        self._next = 0
        self._handle = open(path, "wb")  # noqa: SIM115 (closed by close(), on success or failure)
        self._handle.write(len(text).to_bytes(8, "little") + text)

    def write(self, name: str, tensor: Any) -> None:
        """Append ``name``'s data: it must be the next name of :attr:`order`, with the dtype and shape declared."""
        expected = self.order[self._next] if self._next < len(self.order) else None
        if name != expected or tensor.dtype != self._dtypes[name] or tuple(tensor.shape) != self._shapes[name]:
            raise ValueError(f"safetensors writer: got {name!r} {tensor.dtype} {tuple(tensor.shape)}, not {expected!r}")
        self._handle.write(tensor_buffer(tensor))
        self._next += 1

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        """Close the file; when nothing failed, every declared tensor must have been written."""
        self._handle.close()
        if kind is None and self._next != len(self.order):
            raise ValueError(f"safetensors writer: {len(self.order) - self._next} declared tensors were not written")
