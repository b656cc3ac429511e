"""Test inputs whose ranking is unambiguous, and the checks that compare prunereg with torch.

torch's ``topk`` breaks ties in no documented order, so masks can be compared
with torch's only where no two scores tie at the pruning boundary: these
helpers build such inputs and detect the rare remaining ties.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

# Largest n for which 1..n are all exactly representable (and so distinct).
_EXACT_INTEGERS = {torch.float32: 2**24, torch.float64: 2**53, torch.float16: 2048, torch.bfloat16: 256}

# Tensor shapes of 1 to 5 dims with at most 256 entries, so 1..n stays exact in bfloat16.
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=5).filter(lambda s: torch.Size(s).numel() <= 256)


def distinct_values(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A tensor of ``shape`` whose absolute values are 1..n in random order and random signs."""
    n = torch.Size(shape).numel()
    assert n <= _EXACT_INTEGERS[dtype], "1..n would not be distinct in this dtype"
    generator = torch.Generator().manual_seed(seed)
    magnitudes = torch.randperm(n, generator=generator).to(torch.float64) + 1
    signs = torch.randint(0, 2, (n,), generator=generator).to(torch.float64) * 2 - 1
    return (magnitudes * signs).reshape(shape).to(dtype)


def normal_values(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Standard normal values in ``dtype``: sums and norms of them almost never tie."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


def ties_at_boundary(scores: torch.Tensor, k: int) -> bool:
    """Whether the ``k`` smallest of ``scores`` are ambiguous (a tie between the k-th and the next)."""
    flat = scores.reshape(-1).to(torch.float64).sort().values
    return 0 < k < flat.numel() and bool(flat[k - 1] == flat[k])


def assert_same_tensor(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Equal values, and the same shape, dtype and device."""
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    assert ours.device == theirs.device, (ours.device, theirs.device)
    assert torch.equal(ours, theirs), (ours, theirs)


def module_with(tensor: torch.Tensor, name: str = "w") -> torch.nn.Module:
    """A bare module holding ``tensor`` as the parameter ``name``."""
    module = torch.nn.Module()
    module.register_parameter(name, torch.nn.Parameter(tensor.clone()))
    return module
