"""The tensor dtypes that pruning computes with, and the floating-point ones it leaves alone.

torch's pruning methods rank entries with ``abs``, norms, sorting and random
draws, which torch implements for float16, bfloat16, float32 and float64 only.
Narrower floating-point formats (float8 and float4 variants) hold quantized
weights that these methods cannot rank; they are left as they are, and said so.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

PRUNABLE_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def is_prunable(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s dtype is one that pruning computes with."""
    return tensor.dtype in PRUNABLE_DTYPES


def unprunable_floats(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.dtype]:
    """The floating-point tensors, by name, whose dtype pruning cannot compute with (float8, ...)."""
    return {
        name: tensor.dtype for name, tensor in tensors.items() if tensor.is_floating_point() and not is_prunable(tensor)
    }


def describe_unprunable(found: Mapping[str, torch.dtype], shown: int = 3) -> str:
    """``found`` in a few words for a one-line note: how many, and the first names with their dtypes."""
    names = [f"{name!r} ({str(dtype).removeprefix('torch.')})" for name, dtype in list(found.items())[:shown]]
    more = f" and {len(found) - shown} more" if len(found) > shown else ""
    tensors = "tensor" if len(found) == 1 else "tensors"
    return f"{len(found)} floating-point {tensors} of a dtype that cannot be pruned: {', '.join(names)}{more}"
