"""Validation of pruning amounts and dimensions, with torch's rules and error types.

These functions mirror the private helpers of ``torch.nn.utils.prune`` one for
one (``prunereg.prune`` re-exports them under torch's names), so that an amount
that torch accepts or rejects is accepted or rejected here in the same way.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import torch


def validate_amount_init(amount: object) -> None:
    """Reject an ``amount`` that is no real number, a negative int, or a float outside [0, 1]."""
    integral = _integral(amount)
    if not integral and type(amount) is not float and not isinstance(amount, numbers.Real):
        raise TypeError(f"Invalid type for amount: {amount}. Must be int or float.")
    if (integral and cast(int, amount) < 0) or (not integral and not 0.0 <= float(cast(float, amount)) <= 1.0):
        raise ValueError(f"amount={amount} should either be a float in the range [0, 1] or a non-negative integer")


def validate_amount(amount: float, tensor_size: int) -> None:
    """Reject an absolute (integer) amount larger than the number of units to prune."""
    if _integral(amount) and amount > tensor_size:
        raise ValueError(f"amount={amount} should be smaller than the number of parameters to prune={tensor_size}")


def nparams_to_prune(amount: numbers.Real, tensor_size: int) -> int:
    """Units to prune: an int is absolute, a float a fraction (:func:`count_for`)."""
    if _integral(amount):
        return int(cast(int, amount))
    return count_for(cast(float, amount), tensor_size)  # cast: mypy does not know the numeric tower


def _integral(amount: object) -> bool:
    """``isinstance(amount, numbers.Integral)``, answered without the ABC machinery for a plain int or float.

    Every pruning call checks its amount, and an ABC's isinstance costs more than the rest of that check.
    """
    kind = type(amount)
    if kind is int:
        return True
    if kind is float:
        return False
    return isinstance(amount, numbers.Integral)


def count_for(fraction: float, units: int) -> int:
    """How many of ``units`` entries (or channels) a ``fraction`` in [0, 1] prunes: the nearest whole number.

    ``round(fraction * units)``, half to even as Python's ``round`` (torch's rule
    for a float ``amount``): the one rounding rule of every fraction in prunereg,
    a method's float ``amount`` (:func:`nparams_to_prune`) and a calibrated
    method's ``sparsity`` alike. The fraction is not checked here: methods check
    it when they are built. An int ``fraction`` counts as a fraction too (1 prunes all).
    """
    return round(fraction * units)


def validate_structured(t: torch.Tensor) -> None:
    """Structured pruning removes slices, so the tensor needs at least two dimensions."""
    shape = t.shape
    if len(shape) <= 1:
        raise ValueError(
            "Structured pruning can only be applied to multidimensional tensors. "
            f"Found tensor of shape {shape} with {len(shape)} dims"
        )


def validate_dim(t: torch.Tensor, dim: int) -> None:
    """Reject a ``dim`` past the tensor's last dimension (too-negative dims fail later, as in torch)."""
    if dim >= t.dim():
        raise IndexError(f"Invalid index {dim} for tensor of size {t.shape}")


def compute_norm(t: torch.Tensor, n: int | float | str, dim: int) -> torch.Tensor:
    """The ``n``-norm of every slice of plain ``t`` along ``dim`` (norm over all other dims).

    :func:`prunereg._distributed.channel_norms` takes DTensors too.
    """
    import torch

    dims = list(range(t.dim()))
    if dim < 0:
        dim = dims[dim]
    dims.remove(dim)
    if n is not None and not isinstance(n, str) and t.layout == torch.strided and t.device.type in _VECTOR_NORM_DEVICES:
        # What torch.norm itself calls for a numeric p on these devices, without its dispatch in Python.
        return torch.linalg.vector_norm(t, n, dims)
    return torch.norm(t, p=n, dim=dims)


# Devices on which torch.norm with a numeric p is torch.linalg.vector_norm (torch/functional.py).
_VECTOR_NORM_DEVICES = frozenset({"cpu", "cuda", "meta"})
