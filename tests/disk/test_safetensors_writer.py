"""``SafetensorsWriter``: a safetensors file written a tensor at a time is the file ``save_file`` writes at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from prunereg._disk.safetensors_file import SafetensorsWriter

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2]  # fmt: skip


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=generator) * 50
    return values > 0 if dtype is torch.bool else values.to(dtype)


def _written(path: Path, tensors: dict[str, torch.Tensor]) -> bytes:
    entries = {name: (tensor.dtype, tuple(tensor.shape)) for name, tensor in tensors.items()}
    with SafetensorsWriter(path, entries, {"format": "pt"}) as writer:
        for name in writer.order:
            writer.write(name, tensors[name])
    return path.read_bytes()


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    st.dictionaries(
        st.text("abcxyz._0123456789", min_size=1, max_size=12),
        st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 5), max_size=3), st.integers(0, 2**16)),
        min_size=1,
        max_size=6,
    )
)
def test_the_file_is_save_files_byte_for_byte(tmp_path_factory: pytest.TempPathFactory, spec: dict) -> None:  # type: ignore[type-arg]
    folder = tmp_path_factory.mktemp("writer")
    tensors = {name: _tensor(dtype, tuple(shape), seed) for name, (dtype, shape, seed) in spec.items()}
    save_file(tensors, str(folder / "reference.safetensors"), metadata={"format": "pt"})
    assert _written(folder / "mine.safetensors", tensors) == (folder / "reference.safetensors").read_bytes()
    loaded = load_file(folder / "mine.safetensors")
    assert all(torch.equal(loaded[name], tensor) for name, tensor in tensors.items())


def test_a_tensor_out_of_order_or_unlike_its_declaration_is_refused(tmp_path: Path) -> None:
    tensors = {"a": torch.ones(2, 3), "b": torch.zeros(4)}
    entries = {name: (tensor.dtype, tuple(tensor.shape)) for name, tensor in tensors.items()}
    with SafetensorsWriter(tmp_path / "x.safetensors", entries, {}) as writer:
        with pytest.raises(ValueError, match=r"got 'b' torch.float32 \(4,\), not 'a'"):
            writer.write("b", tensors["b"])
        with pytest.raises(ValueError, match=r"got 'a' torch.float64 \(2, 3\), not 'a'"):
            writer.write("a", tensors["a"].double())
        writer.write("a", tensors["a"])
        writer.write("b", tensors["b"])


def test_leaving_before_every_tensor_is_written_is_an_error_unless_something_else_failed(tmp_path: Path) -> None:
    entries = {"a": (torch.float32, (2,)), "b": (torch.float32, (2,))}
    with (
        pytest.raises(ValueError, match="1 declared tensors were not written"),
        SafetensorsWriter(tmp_path / "x.safetensors", entries, {}) as writer,
    ):
        writer.write("a", torch.ones(2))
    with (  # the first error is the one that surfaces
        pytest.raises(KeyError, match="the caller's own"),
        SafetensorsWriter(tmp_path / "y.safetensors", entries, {}),
    ):
        raise KeyError("the caller's own")
