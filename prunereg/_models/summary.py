"""How sparse each tensor is, as data and as a table.

:func:`summary` describes a module's parameters (a pruned one as the tensor
its forward uses, ``<name>_orig * <name>_mask``); ``prunereg report`` builds
the same :class:`Summary` from a model file, so both print the same table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, overload

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

from prunereg._core.method import BasePruningMethod
from prunereg._models.grouping import GroupedSummary, grouped
from prunereg._models.table import aligned, bar, percent
from prunereg._plugins.loading import registry
from prunereg._text import printable

PRUNING_HOOKS = (BasePruningMethod, torch_prune.BasePruningMethod)


@dataclass(frozen=True)
class TensorSummary:
    """One tensor: its shape, dtype, size, zeros, and the methods that pruned it (oldest first)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    numel: int
    zeros: int
    pruned_by: tuple[str, ...] = ()

    @property
    def sparsity(self) -> float:
        """The share of entries that are zero, from 0.0 to 1.0 (0.0 for an empty tensor)."""
        return _sparsity(self.zeros, self.numel)

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-able data; every key is always present."""
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "numel": self.numel,
            "zeros": self.zeros,
            "sparsity": self.sparsity,
            "pruned_by": list(self.pruned_by),
        }


@dataclass(frozen=True)
class Summary:
    """Rows of :class:`TensorSummary` and their totals; ``str()`` is the table ``prunereg report`` prints."""

    rows: tuple[TensorSummary, ...]

    @property
    def numel(self) -> int:
        return sum(row.numel for row in self.rows)

    @property
    def zeros(self) -> int:
        return sum(row.zeros for row in self.rows)

    @property
    def sparsity(self) -> float:
        """Zeros over entries of all rows together."""
        return _sparsity(self.zeros, self.numel)

    def as_dicts(self) -> list[dict[str, Any]]:
        """The rows as JSON-able dicts."""
        return [row.as_dict() for row in self.rows]

    def as_dict(self) -> dict[str, Any]:
        """Rows and totals, as ``prunereg report --json`` prints them."""
        total = {"numel": self.numel, "zeros": self.zeros, "sparsity": self.sparsity}
        return {"tensors": self.as_dicts(), "total": total}

    def grouped(self, by: str) -> GroupedSummary:
        """The rows summed per block (``by="block"``) or per type (``by="type"``); see :func:`summary`."""
        return grouped(self.rows, by)

    def __str__(self) -> str:
        return format_table(self)


@overload
def summary(module: nn.Module, by: None = None) -> Summary: ...
@overload
def summary(module: nn.Module, by: str) -> GroupedSummary: ...


def summary(module: nn.Module, by: str | None = None) -> Summary | GroupedSummary:
    """The sparsity of every parameter of ``module``, and of all of them together.

    A pruned parameter is listed under its own name (``weight``, not
    ``weight_orig``) with the values the forward uses, ``weight_orig *
    weight_mask``, and the name(s) of the method(s) that pruned it, oldest
    first. Modules pruned by ``torch.nn.utils.prune`` are described the same
    way. A parameter shared by several modules is listed once. ::

        print(prunereg.summary(model))              # a table
        rows = prunereg.summary(model).as_dicts()   # data, JSON-able

    ``by="block"`` sums the rows of each block (``model.layers.3``: the name
    up to its first layer number), ``by="type"`` those of each tensor type
    over all blocks (``model.layers.*.self_attn.q_proj.weight``), into a
    :class:`GroupedSummary` of :class:`GroupSummary` rows: 30 rows instead
    of 270 for a 30-layer model. Names without a layer number (embeddings,
    the head) stay rows of their own.

    Raises ``ValueError`` for parameters on the meta device (they hold no values).
    """
    hooks = {
        (prefix, hook._tensor_name): (submodule, hook)
        for prefix, submodule in module.named_modules()
        for hook in submodule._forward_pre_hooks.values()
        if isinstance(hook, PRUNING_HOOKS)
    }
    names = _MethodNames()
    rows = []
    with torch.no_grad():
        for full_name, parameter in module.named_parameters():
            prefix, _, own_name = full_name.rpartition(".")
            pruned = hooks.get((prefix, own_name.removesuffix("_orig"))) if own_name.endswith("_orig") else None
            if pruned is None:
                rows.append(tensor_summary(full_name, parameter))
                continue
            submodule, hook = pruned
            tensor_name = hook._tensor_name
            effective = parameter * getattr(submodule, tensor_name + "_mask")
            name = f"{prefix}.{tensor_name}" if prefix else tensor_name
            rows.append(tensor_summary(name, effective, names.of(hook), dtype=parameter.dtype))
    return Summary(tuple(rows)) if by is None else grouped(rows, by)


def tensor_summary(
    name: str, tensor: torch.Tensor, pruned_by: Iterable[str] = (), *, dtype: torch.dtype | None = None
) -> TensorSummary:
    """The row for ``tensor`` (shown as ``dtype`` when given: a product's dtype may differ from the weight's)."""
    if tensor.is_meta:
        raise ValueError(f"cannot count the zeros of {name!r}: it is on the meta device, which holds no values")
    return TensorSummary(
        name=name,
        shape=tuple(tensor.shape),
        dtype=str(dtype or tensor.dtype).removeprefix("torch."),
        numel=tensor.numel(),
        zeros=int((tensor == 0).sum()),
        pruned_by=tuple(pruned_by),
    )


class _MethodNames:
    """The registered name of a pruning hook's method class, found without importing any plugin's classes."""

    def __init__(self) -> None:
        self._by_target: dict[str, str] | None = None

    def of(self, hook: object) -> tuple[str, ...]:
        """The names of the methods in ``hook``, oldest first (several for a container).

        A mask that global pruning installed (``custom_from_mask``, torch's
        mechanism) is named after the method that chose it (``chosen_by``).
        """
        methods = getattr(hook, "_pruning_methods", None)
        if methods is None:
            methods = (hook,)
        return tuple(
            self._name(getattr(method, "chosen_by", None) or type(method)) for method in methods if method is not None
        )

    def _name(self, cls: type) -> str:
        if self._by_target is None:
            self._by_target = _registered_targets()
        found = self._by_target.get(f"{cls.__module__}:{cls.__qualname__}")
        return found if found is not None else _snake_case(cls.__name__)


def _registered_targets() -> dict[str, str]:
    methods = registry()
    found: dict[str, str] = {}
    for name in methods.names():
        found.setdefault(methods.info(name).target, name)
    return found


def _snake_case(class_name: str) -> str:
    """``L1Unstructured`` -> ``l1_unstructured``: torch's class names spelled as the registry's names."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", class_name).lower()


def format_table(report: Summary) -> str:
    """Aligned columns, one row per tensor and a total, each with a bar of its sparsity.

    The column ``PRUNED BY`` appears only when a row was pruned by a known method.
    """
    with_methods = any(row.pruned_by for row in report.rows)
    header = ["NAME", "SHAPE", "DTYPE", "NUMEL", "ZEROS", "SPARSITY", ""] + (["PRUNED BY"] if with_methods else [])
    lines = [header]
    for row in report.rows:
        line = [
            printable(row.name),
            "x".join(map(str, row.shape)) or "scalar",
            row.dtype,
            f"{row.numel:,}",
            f"{row.zeros:,}",
            percent(row.sparsity),
            bar(row.sparsity),
        ]
        lines.append(line + ([printable("+".join(row.pruned_by))] if with_methods else []))
    total = ["total", "", "", f"{report.numel:,}", f"{report.zeros:,}", percent(report.sparsity), bar(report.sparsity)]
    lines.append(total + ([""] if with_methods else []))
    return aligned(lines, right_aligned={3, 4, 5})


def _sparsity(zeros: int, numel: int) -> float:
    return zeros / numel if numel else 0.0
