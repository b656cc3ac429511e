"""Successive pruning of one tensor: each new method acts only on what is left."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from prunereg import _distributed
from prunereg._method import BasePruningMethod


class PruningContainer(BasePruningMethod):
    """The history of pruning methods applied to one tensor, newest last.

    Its mask is the newest method's mask computed on what the earlier ones left:
    ``"unstructured"`` methods see the entries still equal to 1, ``"structured"``
    ones the channels along their ``dim`` that are not all zero, ``"global"``
    ones the whole tensor.
    """

    def __init__(self, *args: BasePruningMethod) -> None:
        self._pruning_methods: tuple[BasePruningMethod, ...] = ()
        if args:
            # torch leaves the name unset for several methods and then fails (AttributeError).
            self._tensor_name = args[0]._tensor_name
        for method in args:
            self.add_pruning_method(method)

    def add_pruning_method(self, method: BasePruningMethod | None) -> None:
        """Append ``method``, which must act on the same tensor as the others."""
        if not isinstance(method, BasePruningMethod) and method is not None:
            raise TypeError(f"{type(method)} is not a BasePruningMethod subclass")
        if method is not None and self._tensor_name != method._tensor_name:
            raise ValueError(
                "Can only add pruning methods acting on the parameter named "
                f"'{self._tensor_name}' to PruningContainer {self}. "
                f"Found '{method._tensor_name}'"
            )
        self._pruning_methods += (method,)  # type: ignore[operator]

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self) -> Iterator[BasePruningMethod]:
        return iter(self._pruning_methods)

    def __getitem__(self, idx: int) -> BasePruningMethod:
        return self._pruning_methods[idx]

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """The newest method's mask, computed on what ``default_mask`` has left."""
        return combine_masks(self._pruning_methods[-1], t, default_mask)


def combine_masks(method: BasePruningMethod, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Apply ``method`` to the part of ``t`` that ``mask`` still keeps, per its ``PRUNING_TYPE``.

    Returns a new contiguous mask in ``t``'s dtype; ``mask`` is left as it was
    (torch writes into it when the dtypes agree).
    """
    if _distributed.is_dtensor(t):
        return _distributed.combine_masks(method, t, mask)
    new_mask = mask.to(dtype=t.dtype, memory_format=torch.contiguous_format, copy=True)
    slc = _remaining(method, t, mask)
    partial_mask = method.compute_mask(t[slc], default_mask=mask[slc])
    new_mask[slc] = partial_mask.to(dtype=new_mask.dtype)
    return new_mask


def _remaining(method: BasePruningMethod, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | tuple[object, ...]:
    kind = method.PRUNING_TYPE
    if t.is_meta and kind in ("unstructured", "structured"):
        # Meta tensors have no values, so what is left cannot be known (and
        # boolean indexing cannot run): only shapes and dtypes matter there.
        return (slice(None),) * t.dim()
    if kind == "unstructured":
        return mask == 1
    if kind == "structured":
        if not hasattr(method, "dim"):
            raise AttributeError(
                'Pruning methods of PRUNING_TYPE "structured" need to have the '
                "attribute `dim` defined."
            )
        n_dims = t.dim()
        dim = method.dim if method.dim >= 0 else n_dims + method.dim
        if dim < 0:
            raise IndexError(f"Index is out of bounds for tensor with dimensions {n_dims}")
        keep_channel = mask.sum(dim=[d for d in range(n_dims) if d != dim]) != 0
        slc: list[object] = [slice(None)] * n_dims
        slc[dim] = keep_channel
        return tuple(slc)
    if kind == "global":
        return (slice(None),) * t.dim()
    raise ValueError(f"Unrecognized PRUNING_TYPE {kind}")
