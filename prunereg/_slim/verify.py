"""Checking a slimmed model against its plan: every operation makes the tensor shape the plan says.

The plan gives every tensor of the exported graph its shape after the cut:
each dimension keeps the positions whose units stay. A module that computes
a size from somewhere the graph cannot see (``self.num_heads``, the width of
its input, a constant in its code) can still run after the cut and compute
something else: two heads of width 4 viewed as four heads of width 2. So the
slimmed model is captured again, and its operations are compared one by one
with the plan's; the first that differs names the module. The capture is
needed only when an operation that takes its sizes from the code (a view, a
reshape, an expand...) gets another shape from the plan: otherwise every
size follows from the tensors, which the plan set.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from torch import Tensor

from prunereg._slim.capture import Captured
from prunereg._slim.graph import DependencyGraph, NodeDims

SIZED = frozenset(
    f"aten.{name}"
    for name in (
        "view", "reshape", "_unsafe_view", "unflatten", "expand", "broadcast_to", "repeat", "split_with_sizes",
        "new_zeros", "new_ones", "new_empty", "new_full", "zeros", "ones", "full", "empty", "narrow", "view_as",
    )
)  # fmt: skip
"""Operations whose output sizes are arguments written by the model's code, not read from their inputs."""


@dataclass(frozen=True)
class Mismatch:
    """The first operation of the slimmed model that does not make what the plan says."""

    module: str
    """The module running it ("" for the model's own forward)."""
    message: str


def planned_shapes(graph: DependencyGraph, removed: set[int]) -> list[tuple[NodeDims, tuple[int, ...]]]:
    """Each operation with a tensor output, and that output's shape once the units ``removed`` are gone."""
    kept = graph.kept(removed)
    return [(node, tuple(int(kept[ids].sum()) for ids in node.dims)) for node in graph.nodes if node.dims is not None]


def needs_capture(graph: DependencyGraph, planned: list[tuple[NodeDims, tuple[int, ...]]]) -> bool:
    """Whether an operation taking its sizes from the code gets another shape from the plan.

    A dimension the operation sizes from its input (a view's ``-1``, ``flatten``)
    follows the plan as its input does: only one the code writes can disagree.
    """
    return any(
        node.op in SIZED
        and any(
            size != ids.numel() and dim not in node.from_input
            for dim, (size, ids) in enumerate(zip(shape, node.dims, strict=True))  # type: ignore[arg-type]
        )
        for node, shape in planned
    )


ELIDED = frozenset({"aten.clone"})
"""Operations torch runs or skips by the layout of a tensor (``contiguous()`` of a tensor that already is, as one of
a single head is): the two graphs are paired without them."""

SAME_OP = {"aten._unsafe_view": "aten.view"}
"""Operations one of which stands for the other by layout (``reshape`` of a contiguous tensor is a view)."""


def compare(
    graph: DependencyGraph, planned: list[tuple[NodeDims, tuple[int, ...]]], exported: Captured
) -> Mismatch | None:
    """The first operation of ``exported`` (the slimmed model) that differs from the plan for ``graph``, or ``None``.

    The operations are paired in order, those torch runs or skips by layout
    (:data:`ELIDED`) left out: a narrower tensor may be contiguous where the
    wider one was not.
    """
    shapes = {node.name: shape for node, shape in planned}
    model_ran = [node for node in graph.nodes if node.op not in ELIDED]
    slimmed_runs = [operation for operation in _operations(exported) if operation[1] not in ELIDED]
    for index, (_, op, module, shape) in enumerate(slimmed_runs):
        ran = model_ran[index] if index < len(model_ran) else None
        if ran is None or SAME_OP.get(ran.op, ran.op) != SAME_OP.get(op, op):
            return Mismatch(
                module, f"{_where(module)} runs {op} where the model ran {ran.op if ran else 'no such operation'}"
            )
        planned_shape = shapes.get(ran.name)
        if planned_shape is not None and shape is not None and shape != planned_shape:
            return Mismatch(
                module,
                f"{_where(module)} makes a tensor of shape {list(shape)} by {op} where the plan has "
                f"{list(planned_shape)}",
            )
    return None


def _operations(exported: Captured) -> Iterator[tuple[str, str, str, tuple[int, ...] | None]]:
    for node in exported.graph.nodes:
        if node.op != "call_function":
            continue
        packet = getattr(node.target, "overloadpacket", None)
        op = f"aten.{packet.__name__}" if packet is not None else str(getattr(node.target, "__name__", node.target))
        stack = node.meta.get("nn_module_stack") or {}
        module = str(list(stack.values())[-1][0]) if stack else ""
        value = node.meta.get("val")
        shape = tuple(int(s) for s in value.shape) if isinstance(value, Tensor) else None
        yield node.name, op, module, shape


def _where(module: str) -> str:
    return f"'{module}'" if module else "the model's forward"
