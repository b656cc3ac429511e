"""prunereg needs no numpy: torch does not install it, and a clean ``pip install prunereg`` lacks it.

Each path that reads a tensor's bytes (slimming's unit signatures, the
safetensors writer, the ranks' fingerprints) runs in a process where numpy
cannot be imported, and ``tensor_buffer`` gives numpy's bytes where numpy is there.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunereg._bytes import tensor_buffer

WITHOUT_NUMPY = textwrap.dedent(
    """
    import sys, tempfile, os
    sys.modules["numpy"] = None  # import numpy raises ImportError, as where it is not installed
    import warnings
    warnings.simplefilter("ignore")  # torch says once that it found no numpy
    import torch
    from torch import nn
    import prunereg
    from prunereg._disk.safetensors_file import SafetensorsWriter
    from prunereg._runtime.ranks import digest
    from pathlib import Path
    from safetensors.torch import load_file

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    prunereg.slim(model, torch.randn(2, 8), ratio=0.5)
    assert model[0].out_features == 8, model

    tensors = {"a": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "b": torch.tensor([True, False])}
    path = Path(tempfile.mkdtemp()) / "x.safetensors"
    entries = {name: (tensor.dtype, tuple(tensor.shape)) for name, tensor in tensors.items()}
    with SafetensorsWriter(path, entries, {}) as writer:
        for name in writer.order:
            writer.write(name, tensors[name])
    assert all(torch.equal(load_file(path)[name], tensor) for name, tensor in tensors.items())
    assert digest(torch.ones(3)) != digest(torch.zeros(3))
    print("ok")
    """
)


def test_slimming_writing_safetensors_and_fingerprints_run_where_numpy_cannot_be_imported() -> None:
    finished = subprocess.run([sys.executable, "-c", WITHOUT_NUMPY], capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert finished.stdout.strip().endswith("ok")


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int64, torch.bool]


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=3),
    transposed=st.booleans(),
)
def test_tensor_buffer_holds_the_bytes_numpy_gives(dtype: torch.dtype, shape: list[int], transposed: bool) -> None:
    numpy = pytest.importorskip("numpy")
    tensor = (torch.randn(shape) * 10).to(dtype)
    if transposed and tensor.dim() >= 2:
        tensor = tensor.transpose(0, 1)  # not contiguous
    expected = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
    assert bytes(tensor_buffer(tensor)) == expected
    assert numpy is not None


def test_tensor_buffer_resolves_a_conjugate_view_and_keeps_a_temporary_alive() -> None:
    values = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    assert bytes(tensor_buffer(values.conj())) == bytes(tensor_buffer(values.conj().resolve_conj()))
    buffer = tensor_buffer(torch.arange(1000, dtype=torch.int32) * 2)  # the only reference to that tensor
    import gc

    gc.collect()
    assert bytes(buffer[:8]) == bytes(tensor_buffer(torch.tensor([0, 2], dtype=torch.int32)))
