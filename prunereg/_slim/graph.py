"""The channel dependency graph of a model, read from its ATen graph.

The ATen graph (not autograd's) gives every operation with the shapes of its
inputs and outputs, whatever Python the model runs, tuples and caches included:
one eager forward recorded by :mod:`prunereg._slim.capture`, or
``torch.export`` where that could mislead (:func:`capture_model`). Each
dimension of each tensor gets an array of channel ids
(:mod:`prunereg._slim.ids`) and each operation couples them by a rule below: a
residual add couples the added tensors' channels position by position, a
concatenation lays its inputs' ids end to end, a split hands out slices of
them, a grouped or depthwise convolution couples each group's input and output
channels, a reshape into heads couples each head's positions (heads go whole;
their width stays), attention couples queries, keys and values head by head
(with grouped KV heads, a KV head with its group of query heads), and so on. An
operation without a rule pins what it touches, naming itself, so a channel only
ever goes where every rule says it may.

The result, :class:`DependencyGraph`, says for each parameter and buffer which
id every position of every dimension carries; :mod:`prunereg._slim.groups`
turns that into removable units.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import logging
import math
import operator
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import Node

from prunereg._slim.capture import Captured, EagerCapture, capture
from prunereg._slim.ids import IdArray, Ids

Dims = list[IdArray]
"""The ids of a tensor: one 1-D id tensor per dimension, as long as that dimension."""

INPUT = "a model input keeps its shape"
OUTPUT = "a model output keeps its shape"


@dataclass(frozen=True)
class NodeDims:
    """One operation of the exported graph: its name and ATen name, the module running it, its output's ids."""

    name: str
    op: str
    module: str
    dims: Dims | None
    from_input: frozenset[int] = frozenset()
    """Output dimensions whose size the operation takes from its input's shape, whatever its code says: a view's
    ``-1``, every dimension of ``flatten``'s view (marked by the eager capture)."""


class SlimError(RuntimeError):
    """A model that cannot be slimmed as asked; the model is left exactly as it was."""


@dataclass
class DependencyGraph:
    """Which channel id each position of each parameter and buffer dimension carries."""

    ids: Ids
    tensors: dict[str, Dims]
    """Parameter or buffer name (as in ``named_parameters``) to the ids of its dimensions."""
    producers: set[tuple[str, int]] = field(default_factory=set)
    """``(tensor name, dim)`` that makes channels: output rows of Linear and convolution weights, embedding columns."""
    consumers: set[tuple[str, int]] = field(default_factory=set)
    """``(tensor name, dim)`` that reads channels: input columns of Linear and convolution weights."""
    conv_groups: dict[str, int] = field(default_factory=dict)
    """Grouped or depthwise convolution's module name to its output channels per group (whole groups go)."""
    norm_groups: dict[str, int] = field(default_factory=dict)
    """GroupNorm's module name to its channels per group (whole groups go)."""
    macs: list[tuple[list[IdArray], int]] = field(default_factory=list)
    """Per matrix product or convolution: the dimensions its multiply-accumulates run over, and a constant factor."""
    nodes: list[NodeDims] = field(default_factory=list)
    """Every operation of the graph in order, with the ids of the tensor it makes (``None``: none, or several)."""
    head_splits: list[tuple[str, IdArray, int]] = field(default_factory=list)
    """Per reshape into heads: the module doing it, the ids of its heads, and the width of one head."""
    aligned: list[tuple[IdArray, int]] = field(default_factory=list)
    """Dimensions whose width must stay a multiple of a count of positions (torch's grouped product wants strides
    in multiples of 16 bytes): their ids and that count."""

    def multiple(self, units: Iterable[int]) -> int:
        """The count that the number of ``units`` (roots) a dimension keeps must be a multiple of (1: any)."""
        wanted = set(units)
        found = 1
        for ids, count in self.aligned:
            if wanted.intersection(self.ids.roots(ids).tolist()):
                found = math.lcm(found, count)
        return found

    def kept(self, removed: set[int]) -> Tensor:
        """Per id: whether its position stays when the units ``removed`` go (units are roots)."""
        roots = self.ids.all_roots()
        gone = torch.zeros(roots.numel(), dtype=torch.bool)
        if removed:
            gone[torch.tensor(sorted(removed), dtype=torch.int64)] = True
        return ~gone[roots]

    def count_macs(self, removed: set[int] | None = None) -> int:
        """Multiply-accumulates of one forward on the example inputs; with ``removed`` units gone if given."""
        kept = self.kept(removed) if removed else None
        total = 0
        for dims, factor in self.macs:
            count = factor
            for ids in dims:
                count *= int(kept[ids].sum()) if kept is not None else ids.numel()
            total += count
        return total


_THROUGH_EXPORT: contextvars.ContextVar[bool] = contextvars.ContextVar("prunereg_slim_export", default=False)


@contextlib.contextmanager
def through_export() -> Iterator[None]:
    """Every capture inside goes through ``torch.export``, as a model on the meta device does (tests compare both)."""
    token = _THROUGH_EXPORT.set(True)
    try:
        yield
    finally:
        _THROUGH_EXPORT.reset(token)


def capture_model(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, on_meta: bool = False
) -> Captured:
    """The ATen graph of ``model`` on the example inputs, with no output from torch; the model as it was after.

    One eager forward (:mod:`prunereg._slim.capture`) where it can: a model whose
    tensors hold values and whose code reads none of them (``.item()``, a branch
    on a tensor, a boolean index), since a branch on values would be followed
    one way only; ``torch.export`` for the rest, which refuses such code
    (transformers' code avoids it when traced). A failure is a :class:`SlimError`
    saying which capture failed.
    """
    try:
        return _capture(model, args, kwargs, eager=not on_meta and not _THROUGH_EXPORT.get(), fall_back=True)
    except _CaptureFailed as failed:
        error = failed.error
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        how = "build the graph of {} with torch.export" if failed.exported else "run {} on the example inputs"
        why = f" (needed as {failed.why})" if failed.why else ""
        message = f"cannot {how.format(type(model).__name__)}{why}: {type(error).__name__}: {first_line}"
        raise SlimError(message) from error


def capture_like(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], like: Captured) -> Captured:
    """The graph of ``model`` (slimmed) captured the way ``like`` (the plan's graph) was, so their nodes pair up.

    Errors are the model's or torch's own.
    """
    try:
        return _capture(model, args, kwargs, eager=isinstance(like, EagerCapture), fall_back=False)
    except _CaptureFailed as failed:
        raise failed.error from failed.error.__cause__


class _CaptureFailed(Exception):
    """A capture's error; ``why``: why the eager capture could not stand for export's, where it ran first."""

    def __init__(self, error: Exception, exported: bool, why: str | None = None) -> None:
        super().__init__(str(error))
        self.error, self.exported, self.why = error, exported, why


def _capture(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, eager: bool, fall_back: bool
) -> Captured:
    """Eager (``fall_back``: through torch.export where the code reads values) or torch.export; errors wrapped."""
    with leaves_no_state(model):
        if eager:
            try:
                captured = capture(model, args, kwargs)
            except Exception as error:
                raise _CaptureFailed(error, exported=False) from None
            if captured.not_export is None or not fall_back:
                return captured
        try:
            with warnings.catch_warnings(), _no_stack_traces(), _lazy_graph_modules(), _torch_silenced():
                warnings.filterwarnings("ignore", message="The tensor attributes? .* assigned during export")
                return torch.export.export(model, args, kwargs=kwargs, strict=False)
        except Exception as error:
            raise _CaptureFailed(error, exported=True, why=captured.not_export if eager else None) from None


@contextlib.contextmanager
def leaves_no_state(model: nn.Module, *, tensors: bool = True) -> Iterator[None]:
    """Put back what a forward inside leaves in ``model``'s modules: caches, and (``tensors``) tensor attributes.

    A module may cache what its forward computed in a dict attribute (timm's
    LeViT keeps its attention biases so in eval mode): the slimmed model must
    not meet what the forward of the model before it left there, and the next
    capture must see the same operations. A pruning hook sets
    ``module.<name>`` while it runs: a capture, or a forward on other values,
    puts the model's own back; after the model's own forward (``tensors=False``)
    they are what it computed.
    """
    held = [(module, dict(_plain_tensors(module)) if tensors else None, _caches(module)) for module in model.modules()]
    try:
        yield
    finally:
        for module, attributes, caches in held:
            if attributes is not None:
                for key in _plain_tensors(module).keys() - attributes.keys():
                    del module.__dict__[key]
                module.__dict__.update(attributes)
            for cache, content in caches:
                cache.clear()
                cache.update(content)


def _caches(module: nn.Module) -> list[tuple[dict[Any, Any], dict[Any, Any]]]:
    """The module's own dict attributes (not torch's ``_parameters``, ``_modules``...), with their content now."""
    return [(value, dict(value)) for key, value in module.__dict__.items() if type(value) is dict and key[:1] != "_"]


@contextlib.contextmanager
def _torch_silenced() -> Iterator[None]:
    """No output from torch while it exports: its log records, and the partial graph it prints when export fails.

    A model export cannot trace made torch print some twenty lines of its graph
    before slimming's one-line error. torch's loggers (those with a level of
    their own; the rest inherit it) are raised above every level, and
    ``sys.stderr`` (where torch prints the graph) goes nowhere, both for the
    export only: the levels and the stream are put back after, whatever happens.
    ``torch.__trace`` (``TORCH_TRACE``'s files, not the terminal) is left alone.
    """
    loggers = [
        logger
        for name, logger in list(logging.root.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and (name == "torch" or name.startswith("torch."))
        and not name.startswith("torch.__") and logger.level != logging.NOTSET
    ]  # fmt: skip
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.CRITICAL + 1)
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    """Skip recording a Python stack trace per graph node (most of export's time on a large model), where torch can."""
    config = getattr(torch.fx, "config", None)
    if config is None or not hasattr(config, "do_not_emit_stack_traces"):
        yield
        return
    saved = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = saved


@contextlib.contextmanager
def _lazy_graph_modules() -> Iterator[None]:
    """Let export skip generating Python code for its graphs, which slimming only reads, where torch can.

    torch.export recompiles its graph module several times (about a fifth of
    its time on a Llama); a lazy graph module writes its code only when run.
    """
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:  # a torch without it: export as it is
        yield
        return
    with _use_lazy_graph_module(True):
        yield


def _plain_tensors(module: nn.Module) -> dict[str, Tensor]:
    return {key: value for key, value in module.__dict__.items() if isinstance(value, Tensor)}


GROUPED = ("whole", "inside")
"""How a grouped (not depthwise) convolution loses channels: whole groups, or the same channels inside each group."""


def build_graph(
    model: nn.Module,
    exported: Captured,
    pinned_modules: Iterable[str] = (),
    grouped: str = "whole",
) -> DependencyGraph:
    """The dependency graph of ``model`` exported; tensors of ``pinned_modules`` (and below) keep every channel.

    ``grouped``: one of :data:`GROUPED`.
    """
    pinned = tuple(pinned_modules)
    fused: set[str] = set()
    while True:  # a split found to be q/k/v (indexed by constants afterwards) is redone the other way
        builder = _Builder(exported, pinned, fused, grouped)
        builder.run()
        if builder.newly_fused <= fused:
            break
        fused |= builder.newly_fused
    graph = builder.result()
    for name, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention):
            _multihead_attention(graph, name, module)
    return graph


def _tensor(graph: DependencyGraph, module_name: str, tensor_name: str) -> Dims | None:
    prefix = f"{module_name}.{tensor_name}" if module_name else tensor_name
    return graph.tensors.get(prefix, graph.tensors.get(prefix + "_orig"))


def _multihead_attention(graph: DependencyGraph, name: str, module: nn.MultiheadAttention) -> None:
    """``nn.MultiheadAttention`` reads its width from its input: input channel e goes with q, k and v channel e."""
    in_proj = _tensor(graph, name, "in_proj_weight")
    if in_proj is None:
        for tensor, dims in graph.tensors.items():
            if tensor.startswith(name + ".") or not name:
                for ids in dims:
                    graph.ids.pin(ids, f"'{name}' (nn.MultiheadAttention with kdim or vdim) is not slimmed")
        return
    width = in_proj[1].numel()
    for part in range(3):
        graph.ids.union_arrays(in_proj[0][part * width : (part + 1) * width], in_proj[1])


def _refuse_symbolic(node: Node, builder: _Builder) -> None:
    values = node.meta.get("val")
    for value in _flatten(values if isinstance(values, (list, tuple)) else [values]):
        if isinstance(value, torch.Tensor) and not all(isinstance(size, int) for size in value.shape):
            raise SlimError(
                f"{_op_text(node)} in {builder.module_name(node)} makes a shape that depends on the data, "
                "which slimming cannot follow"
            )


def _owner(name: str) -> str:
    return name.rpartition(".")[0]


SAME = "same"
"""The coupling of a parameter with its mask or a scale: one tensor, not two layers (a refusal leaves it out)."""

READS = "reads"
"""The coupling of a layer's input columns with the tensor it reads (two layers reading one tensor: a shared input)."""

_COUPLINGS = {
    **dict.fromkeys(("add", "add_", "sub", "sub_", "rsub"), "a residual add"),
    **dict.fromkeys(("mul", "mul_", "div", "div_"), "a gated product"),
    **dict.fromkeys(("cat", "concat", "concatenate"), "a concatenation"),
    **dict.fromkeys(("split", "split_with_sizes", "chunk", "unsafe_split", "unsafe_chunk"), "an equal split"),
    **dict.fromkeys(("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu"), "attention"),
}
"""The coupling each operation makes, as a refusal names it (others: the operation's ATen name)."""

_ELEMENTWISE_COUPLINGS = frozenset(("add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "div", "div_"))


def coupling(kind: str, where: str) -> str:
    """A recorded coupling: its kind (:data:`READS`, "a residual add", ...) and the module it happens in."""
    return f"{kind}\t{where}"


class _Builder:
    def __init__(self, exported: Captured, pinned: tuple[str, ...], fused: set[str], grouped: str) -> None:
        self.exported = exported
        self.input_specs = {
            spec.arg.name: spec for spec in exported.graph_signature.input_specs if hasattr(spec.arg, "name")
        }
        """Each placeholder's input spec (parameter, buffer, user input), by the placeholder's name."""
        self.grouped = grouped
        self.pinned_modules = pinned
        self.fused = fused
        self.newly_fused: set[str] = set()
        self.ids = Ids()
        self.env: dict[Node, Any] = {}
        self.graph = DependencyGraph(self.ids, {})
        self.split_origin: dict[int, str] = {}
        self.node: Node | None = None
        self.state: set[Node] = set()
        """The placeholders of parameters and buffers."""

    # -- running ------------------------------------------------------------------------------------------------
    def run(self) -> None:
        for node in self.exported.graph.nodes:
            self.node = node
            self.ids.coupling = None
            if node.op == "placeholder":
                self.env[node] = self._placeholder(node, self.input_specs.get(node.name))
            elif node.op == "call_function":
                _refuse_symbolic(node, self)
                self.ids.coupling = self._coupling(node)
                self.env[node] = self._call(node)
                out = self.env[node]
                dims = out if isinstance(out, list) and all(isinstance(v, torch.Tensor) for v in out) else None
                if dims is not None and [ids.numel() for ids in dims] != list(_shape(node)):
                    dims = None  # ids not position by position (a rule's fallback): no plan for its shape
                self.graph.nodes.append(
                    NodeDims(node.name, _op_text(node), _module_path(node), dims, _sizes_from_input(node))
                )
            elif node.op == "output":
                for value in _flatten(_a(node)[0]):
                    if isinstance(value, Node):
                        for dims in _tensor_dims(self.env.get(value)):
                            self.pin_dims(dims, OUTPUT)

    def _coupling(self, node: Node) -> str:
        name = _op_name(node.target)
        if name in _ELEMENTWISE_COUPLINGS and any(arg in self.state for arg in _a(node)):
            return coupling(SAME, self.module_name(node))  # a mask, a scale or a shift of one tensor: no coupling
        return coupling(_COUPLINGS.get(name, _op_text(node)), self.module_name(node))

    def result(self) -> DependencyGraph:
        return self.graph

    def _placeholder(self, node: Node, spec: Any) -> Any:
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            return None
        kind = getattr(getattr(spec, "kind", None), "name", "USER_INPUT")
        target = getattr(spec, "target", None)
        if kind in ("PARAMETER", "BUFFER") and isinstance(target, str):
            owner = _owner(target)
            ignored = next((m for m in self.pinned_modules if owner == m or owner.startswith(m + ".") or m == ""), None)
            reason = f"module '{ignored}' is ignored" if ignored is not None else None
            dims = [self.ids.fresh(size, reason) for size in value.shape]
            self.graph.tensors[target] = dims
            self.state.add(node)
            return dims
        reason = INPUT if kind == "USER_INPUT" else f"the constant tensor {target}"
        return [self.ids.fresh(size, reason) for size in value.shape]

    def _call(self, node: Node) -> Any:
        if node.target is operator.getitem:
            container = self.env.get(_a(node)[0])
            index = _a(node)[1]
            if isinstance(container, (list, tuple)) and isinstance(index, int) and index < len(container):
                return container[index]
            return self.fresh_like(node, self.unfollowed_reason(node))
        name = _op_name(node.target)
        rule = _RULES.get(name)
        if rule is None and name.endswith("_") and not name.startswith("_"):
            rule = _RULES.get(name[:-1])  # in place (add_, mul_, relu_): as out of place
        if rule is None:
            if not _any_tensor_input(self, node):
                return self.fresh_like(node, None)  # a factory (arange, zeros, ...): new positions, pinned below
            return self.unfollowed(node)
        return rule(self, node)

    # -- helpers for the rules ----------------------------------------------------------------------------------
    def dims(self, arg: Any) -> Dims | None:
        value = self.env.get(arg) if isinstance(arg, Node) else None
        if isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value):
            return value
        return None

    def module_name(self, node: Node | None = None) -> str:
        target = node if node is not None else self.node
        stack = (target.meta.get("nn_module_stack") if target is not None else None) or {}
        if not stack:
            return "the model"
        path = list(stack.values())[-1][0]
        return f"'{path}'" if path else "the model"

    def unfollowed_reason(self, node: Node) -> str:
        return f"{_op_text(node)} in {self.module_name(node)}, which slimming cannot follow"

    def unfollowed(self, node: Node) -> Any:
        reason = self.unfollowed_reason(node)
        for arg in _flatten((_a(node), node.kwargs)):
            for dims in _tensor_dims(self.env.get(arg) if isinstance(arg, Node) else None):
                self.pin_dims(dims, reason)
        return self.fresh_like(node, reason)

    def fresh_like(self, node: Node, reason: str | None) -> Any:
        def fresh(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return [self.ids.fresh(size, reason or f"positions made by {_op_text(node)}") for size in value.shape]
            if isinstance(value, (list, tuple)):
                return [fresh(v) for v in value]
            return None

        return fresh(node.meta.get("val"))

    def pin_dims(self, dims: Dims, reason: str) -> None:
        for ids in dims:
            self.ids.pin(ids, reason)

    def fixed(self, size: int, why: str = "") -> IdArray:
        return self.ids.fresh(size, why or f"positions made by {_op_text(self.node)}")

    def union(self, a: IdArray, b: IdArray) -> None:
        if a.shape == b.shape:
            self.ids.union_arrays(a, b)

    def positional(self, dims: Dims, dim: int, node: Node) -> None:
        """Pin ``dims[dim]``: ``node`` reads fixed positions of it (an index, a slice, padding)."""
        ids = dims[dim]
        for index in ids.tolist():
            if index in self.split_origin and self.split_origin[index] not in self.fused:
                self.newly_fused.add(self.split_origin[index])
        reason = f"{_op_text(node)} in {self.module_name(node)} reads fixed positions of dimension {dim}"
        self.ids.pin(ids, reason)

    def broadcast(self, node: Node, operands: Sequence[Any], shape: Sequence[int]) -> Dims:
        """Couple same-size dimensions of broadcast ``operands`` (aligned from the right) into ``shape``'s ids."""
        out: Dims = []
        operand_dims = [d for d in (self.dims(op) for op in operands) if d is not None]
        for back in range(1, len(shape) + 1):
            size = shape[-back]
            matching = [d[-back] for d in operand_dims if len(d) >= back and d[-back].numel() == size]
            if not matching:
                out.append(self.fixed(size))
                continue
            for other in matching[1:]:
                self.union(matching[0], other)
            out.append(matching[0])
        return out[::-1]

    def reshape(self, node: Node, dims: Dims, old: Sequence[int], new: Sequence[int]) -> Dims:
        """The ids of a reshape from ``old`` to ``new`` (views, flatten, unflatten, squeeze, unsqueeze)."""
        out: list[IdArray | None] = [None] * len(new)
        for old_group, new_group in _reshape_groups(old, new):
            if len(old_group) == 1 and len(new_group) == 1:
                out[new_group[0]] = dims[old_group[0]]
                continue
            flat = self.merge([dims[i] for i in old_group], [old[i] for i in old_group])
            for j, piece in zip(new_group, self.split(node, flat, [new[j] for j in new_group]), strict=True):
                out[j] = piece
        return [ids if ids is not None else self.fixed(new[j]) for j, ids in enumerate(out)]

    def merge(self, parts: Dims, sizes: Sequence[int]) -> IdArray:
        """Dimensions merged into one (outer first): at most one may carry removable channels."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return self.fixed(1)
        free = [k for k, ids in enumerate(parts) if not self.ids.all_pinned(ids)]
        if len(free) > 1:
            for k in free[1:]:
                self.ids.pin(parts[k], f"{_op_text(self.node)} in {self.module_name()} merges two channel dimensions")
            free = free[:1]
        if not free:
            return self.fixed(math.prod(sizes))
        k = free[0]
        outer, inner = math.prod(sizes[:k]), math.prod(sizes[k + 1 :])
        return parts[k].repeat_interleave(inner).repeat(outer)

    def split(self, node: Node, flat: IdArray, sizes: Sequence[int], *, within: bool = False) -> Dims:
        """One dimension split into ``sizes`` (outer first): the ids each new dimension carries.

        ``within``: the split inside one of q/k/v laid side by side (heads, not q/k/v again).
        """
        if len(sizes) == 1:
            return [flat]
        outer, inner = sizes[0], math.prod(sizes[1:])
        roots = self.ids.roots(flat).reshape(outer, inner)
        if bool((roots == roots[:, :1]).all()):  # each row one class: the outer dimension carries them
            return [roots[:, 0].clone(), *[self.fixed(s) for s in sizes[1:]]]
        if bool((roots == roots[:1]).all()):  # every row alike: the inner dimensions carry them
            return [self.fixed(outer), *self.split(node, roots[0].clone(), sizes[1:], within=within)]
        if node.name in self.fused and not within:  # q/k/v laid side by side: position e of each part goes together
            for column in roots.T:
                self.ids.union_all(column)
            return [self.fixed(outer), *self.split(node, self.ids.roots(roots[0]), sizes[1:], within=True)]
        # heads: each outer position (a head) goes whole and its width stays
        self.ids.coupling = coupling("a reshape into heads", self.module_name(node))
        heads = torch.tensor([self.ids.union_all(row) for row in roots], dtype=torch.int64)
        for index in heads.tolist():
            self.split_origin.setdefault(index, node.name)
        self.graph.head_splits.append((_module_path(node), heads, inner))
        return [heads, *[self.fixed(s) for s in sizes[1:]]]


# -- reshapes ---------------------------------------------------------------------------------------------------
def _reshape_groups(old: Sequence[int], new: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Runs of ``old``'s and ``new``'s dimensions (size-1 ones left out) with equal products, in order."""
    real_old = [i for i, size in enumerate(old) if size != 1]
    real_new = [j for j, size in enumerate(new) if size != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(real_old) and j < len(real_new):
        old_group, new_group = [real_old[i]], [real_new[j]]
        p, q = old[real_old[i]], new[real_new[j]]
        i, j = i + 1, j + 1
        while p != q:
            if p < q and i < len(real_old):
                p *= old[real_old[i]]
                old_group.append(real_old[i])
                i += 1
            elif q < p and j < len(real_new):
                q *= new[real_new[j]]
                new_group.append(real_new[j])
                j += 1
            else:
                raise ValueError(f"cannot reshape {list(old)} into {list(new)}")
        groups.append((old_group, new_group))
    return groups


# -- rules ------------------------------------------------------------------------------------------------------
_Rule = Callable[[_Builder, Node], Any]
_RULES: dict[str, _Rule] = {}


def _rule(*names: str) -> Callable[[_Rule], _Rule]:
    def register(function: _Rule) -> _Rule:
        for name in names:
            _RULES[name] = function
        return function

    return register


def _a(node: Node) -> tuple[Any, ...]:
    """A node's positional arguments, untyped (torch.fx types them as a wide union)."""
    return tuple(node.args)


def _kw(node: Node, name: str, default: Any = None) -> Any:
    return dict(node.kwargs).get(name, default)


def _op_name(target: Any) -> str:
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        return str(packet.__name__)
    return str(getattr(target, "__name__", target))


def _op_text(node: Node | None) -> str:
    if node is None:
        return "an operation"
    packet = getattr(node.target, "overloadpacket", None)
    return f"aten.{packet.__name__}" if packet is not None else str(getattr(node.target, "__name__", node.target))


def _flatten(value: Any) -> Iterable[Any]:
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flatten(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _flatten(item)
    else:
        yield value


def _tensor_dims(value: Any) -> Iterable[Dims]:
    if isinstance(value, list) and value and all(isinstance(v, torch.Tensor) for v in value):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensor_dims(item)


def _any_tensor_input(builder: _Builder, node: Node) -> bool:
    return any(
        isinstance(arg, Node) and isinstance(arg.meta.get("val"), torch.Tensor)
        for arg in _flatten((_a(node), node.kwargs))
    )


def _shape(node: Any) -> tuple[int, ...]:
    value = node.meta.get("val") if isinstance(node, Node) else None
    return tuple(int(s) for s in value.shape) if isinstance(value, torch.Tensor) else ()


def _dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


_ELEMENTWISE = [
    "add",
    "sub",
    "rsub",
    "mul",
    "div",
    "true_divide",
    "floor_divide",
    "remainder",
    "where",
    "maximum",
    "minimum",
    "pow",
    "clamp",
    "clamp_min",
    "clamp_max",
    "relu",
    "relu_",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "hardtanh",
    "hardtanh_",
    "leaky_relu",
    "elu",
    "selu",
    "celu",
    "hardswish",
    "hardsigmoid",
    "mish",
    "softplus",
    "relu6",
    "logit",
    "dropout",
    "alpha_dropout",
    "feature_dropout",
    "native_dropout",
    "clone",
    "contiguous",
    "_to_copy",
    "to",
    "type_as",
    "detach",
    "neg",
    "exp",
    "log",
    "log1p",
    "expm1",
    "sqrt",
    "rsqrt",
    "abs",
    "erf",
    "sin",
    "cos",
    "reciprocal",
    "square",
    "sign",
    "masked_fill",
    "lift_fresh_copy",
    "alias",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_not",
    "logical_and",
    "logical_or",
    "bitwise_not",
    "bitwise_and",
    "bitwise_or",
    "isnan",
    "isinf",
    "nan_to_num",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
    "rand_like",
    "randn_like",
    "fill",
    "lerp",
    "addcmul",
    "addcdiv",
    "_assert_tensor_metadata",
    "copy",
    "float",
    "bfloat16",
    "half",
]


@_rule(*_ELEMENTWISE)
def _elementwise(b: _Builder, node: Node) -> Any:
    value = node.meta.get("val")
    operands = [a for a in _flatten((_a(node), node.kwargs)) if isinstance(a, Node)]
    if isinstance(value, (tuple, list)):  # native_dropout: (output, mask)
        shape = _shape_of(value[0])
        out = b.broadcast(node, operands, shape)
        return [out, *[b.broadcast(node, operands, _shape_of(v)) for v in value[1:]]]
    if not isinstance(value, torch.Tensor):
        return None
    return b.broadcast(node, operands, tuple(value.shape))


def _shape_of(value: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in value.shape) if isinstance(value, torch.Tensor) else ()


@_rule("softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax")
def _softmax(b: _Builder, node: Node) -> Any:
    dims = b.dims(_a(node)[0])
    return list(dims) if dims is not None else b.unfollowed(node)


@_rule("view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as", "reshape_as")
def _view(b: _Builder, node: Node) -> Any:
    dims = b.dims(_a(node)[0])
    if dims is None:
        return b.unfollowed(node)
    old, new = _shape(_a(node)[0]), _shape(node)
    if _op_name(node.target) in ("view", "reshape", "_unsafe_view") and _one_head(old, new):
        # (..., width) -> (..., 1, width): one head of that width (Mistral's single KV head), whole or not at all
        head = torch.tensor([b.ids.union_all(dims[-1])], dtype=torch.int64)
        return [*b.reshape(node, dims[:-1], old[:-1], new[:-2]), head, b.fixed(new[-1])]
    return b.reshape(node, dims, old, new)


def _one_head(old: Sequence[int], new: Sequence[int]) -> bool:
    """Whether a view splits the last dimension into one head: ``(..., w) -> (..., 1, w)`` with the rest alike."""
    return (
        len(old) >= 2 and len(new) == len(old) + 1 and old[-1] > 1 and new[-2:] == (1, old[-1])
        and tuple(new[:-2]) == tuple(old[:-1])
    )  # fmt: skip


@_rule("permute", "transpose", "t", "swapaxes", "movedim", "numpy_T", "mT")
def _permute(b: _Builder, node: Node) -> Any:
    dims = b.dims(_a(node)[0])
    if dims is None:
        return b.unfollowed(node)
    ndim = len(dims)
    name = _op_name(node.target)
    order = list(range(ndim))
    if name == "permute":
        order = [_dim(d, ndim) for d in _a(node)[1]]
    elif name in ("transpose", "swapaxes"):
        a, c = _dim(int(_a(node)[1]), ndim), _dim(int(_a(node)[2]), ndim)
        order[a], order[c] = order[c], order[a]
    elif name in ("t", "numpy_T", "mT"):
        order = order[::-1] if name != "mT" else [*order[:-2], order[-1], order[-2]]
    else:
        return b.unfollowed(node)
    return [dims[k] for k in order]


@_rule("expand", "expand_as", "broadcast_to")
def _expand(b: _Builder, node: Node) -> Any:
    dims = b.dims(_a(node)[0])
    if dims is None:
        return b.unfollowed(node)
    shape = _shape(node)
    lead = len(shape) - len(dims)
    out: Dims = []
    for j, size in enumerate(shape):
        k = j - lead
        out.append(dims[k] if k >= 0 and dims[k].numel() == size else b.fixed(size))
    return out


@_rule("repeat")
def _repeat(b: _Builder, node: Node) -> Any:
    dims = b.dims(_a(node)[0])
    if dims is None:
        return b.unfollowed(node)
    shape = _shape(node)
    lead = len(shape) - len(dims)
    return [
        dims[j - lead].repeat(shape[j] // dims[j - lead].numel()) if j >= lead else b.fixed(s)
        for j, s in enumerate(shape)
    ]


@_rule(
    "select",
    "slice",
    "narrow",
    "index_select",
    "gather",
    "roll",
    "flip",
    "cumsum",
    "cumprod",
    "tril",
    "triu",
    "argmax",
    "argmin",
    "sort",
    "topk",
)
def _positional(b: _Builder, node: Node) -> Any:
    """Operations that read fixed positions of one dimension: that dimension keeps its positions."""
    dims = b.dims(_a(node)[0])
    if dims is None:
        return b.unfollowed(node)
    name = _op_name(node.target)
    ndim = len(dims)
    if name in ("tril", "triu"):
        touched = [ndim - 2, ndim - 1]
    elif name == "flip":
        touched = [_dim(d, ndim) for d in _a(node)[1]]
    elif name in ("argmax", "argmin"):
        dim_arg = _a(node)[1] if len(_a(node)) > 1 else _kw(node, "dim")
        touched = list(range(ndim)) if dim_arg is None else [_dim(int(dim_arg), ndim)]
    elif name == "roll":
        touched = [_dim(d, ndim) for d in (_a(node)[2] if len(_a(node)) > 2 else range(ndim))]
    elif name == "topk":  # topk(input, k, dim=-1)
        touched = [_dim(int(_a(node)[2] if len(_a(node)) > 2 else _kw(node, "dim", -1)), ndim)]
    else:
        dim_arg = _a(node)[1] if len(_a(node)) > 1 else _kw(node, "dim", 0 if name != "sort" else -1)
        touched = [_dim(int(dim_arg), ndim)]
    if not all(0 <= d < ndim for d in touched):
        return b.unfollowed(node)
    shape = _shape(_a(node)[0])
    if name == "slice":
        start, end, step = [*_a(node)[2:5], None, None, None][:3]
        d = touched[0]
        if (start in (None, 0)) and (end is None or int(end) >= shape[d]) and step in (None, 1):
            return list(dims)  # the whole dimension: nothing read by position
    for d in touched:
        b.positional(dims, d, node)
    value = node.meta.get("val")
    if isinstance(value, (tuple, list)):
        return b.fresh_like(node, None)
    out_shape = _shape(node)
    if name == "select":
        rest = [ids for k, ids in enumerate(dims) if k != touched[0]]
        return [ids if ids.numel() == out_shape[k] else b.fixed(out_shape[k]) for k, ids in enumerate(rest)]
    if len(out_shape) == ndim:
        return [
            ids if ids.numel() == out_shape[k] and k not in touched else b.fixed(out_shape[k])
            for k, ids in enumerate(dims)
        ]
    return b.fresh_like(node, None)


@_rule("split", "split_with_sizes", "chunk", "unbind", "tensor_split", "unsafe_split", "unsafe_chunk", "split_copy")
def _split(b: _Builder, node: Node) -> Any:
    dims = b.dims(_a(node)[0])
    value = node.meta.get("val")
    if dims is None or not isinstance(value, (list, tuple)):
        return b.unfollowed(node)
    name = _op_name(node.target)
    ndim = len(dims)
    default_dim = 0
    dim_arg = _a(node)[2] if len(_a(node)) > 2 else _kw(node, "dim", default_dim)
    if name == "unbind":
        dim_arg = _a(node)[1] if len(_a(node)) > 1 else _kw(node, "dim", 0)
    d = _dim(int(dim_arg), ndim)
    ids = dims[d]
    if name == "unbind":
        b.positional(dims, d, node)
        return [[x for k, x in enumerate(dims) if k != d] for _ in value]
    sizes = [int(v.shape[d]) for v in value]
    if len(set(sizes)) != 1 and not b.ids.all_pinned(ids):
        # unequal parts: their sizes are constants in the code
        b.positional(dims, d, node)
    pieces: Dims = []
    start = 0
    for size in sizes:
        pieces.append(ids[start : start + size])
        start += size
    if len(set(sizes)) == 1:  # equal parts stay equal (chunk, split by a size): position i of each goes together
        for piece in pieces[1:]:
            b.union(pieces[0], piece)
    return [[piece if k == d else x for k, x in enumerate(dims)] for piece in pieces]


@_rule("cat", "concat", "concatenate")
def _cat(b: _Builder, node: Node) -> Any:
    tensors = [t for t in _a(node)[0] if isinstance(t, Node)]
    all_dims = [b.dims(t) for t in tensors]
    shape = _shape(node)
    found = [d for d in all_dims if d is not None and len(d) == len(shape)]
    if len(found) != len(all_dims) or not found:
        return b.unfollowed(node)
    dim_arg = _a(node)[1] if len(_a(node)) > 1 else _kw(node, "dim", 0)
    d = _dim(int(dim_arg), len(shape))
    out: Dims = []
    for k in range(len(shape)):
        if k == d:
            out.append(torch.cat([x[k] for x in found]))
        else:
            for other in found[1:]:
                b.union(found[0][k], other[k])
            out.append(found[0][k])
    return out


@_rule("stack")
def _stack(b: _Builder, node: Node) -> Any:
    tensors = [d for d in (b.dims(t) for t in _a(node)[0]) if d is not None]
    if len(tensors) != len(_a(node)[0]):
        return b.unfollowed(node)
    shape = _shape(node)
    dim_arg = _a(node)[1] if len(_a(node)) > 1 else 0
    d = _dim(int(dim_arg), len(shape))
    first = tensors[0]
    for other in tensors[1:]:
        for x, y in zip(first, other, strict=True):
            b.union(x, y)
    out = list(first)
    out.insert(d, b.fixed(shape[d]))
    return out


def _matmul_dims(b: _Builder, node: Node, left: Dims, right: Dims, operands: tuple[Any, Any]) -> Dims:
    out = _matmul_out(b, node, left, right, operands)
    b.graph.macs.append(([*out, left[-1]], 1))
    return out


def _matmul_out(b: _Builder, node: Node, left: Dims, right: Dims, operands: tuple[Any, Any]) -> Dims:
    shape = _shape(node)
    if len(right) >= 2:  # x @ W with W a parameter (GPT-2's Conv1D): W's columns make channels
        _mark_producer(b, operands[1], len(right) - 1)
        _mark_producer(b, operands[1], len(right) - 2, reads=True)
    if len(left) >= 2:
        _mark_producer(b, operands[0], len(left) - 2)
    if len(right) == 1:
        b.union(left[-1], right[0])
        return left[:-1]
    if len(left) == 1:
        b.union(left[0], right[-2])
        return [*right[:-2], right[-1]]
    b.union(left[-1], right[-2])
    batch_shape = shape[:-2]
    lead: Dims = []
    for back in range(1, len(batch_shape) + 1):
        size = batch_shape[-back]
        matching = [d[-2 - back] for d in (left, right) if len(d) >= back + 2 and d[-2 - back].numel() == size]
        for other in matching[1:]:
            b.union(matching[0], other)
        lead.append(matching[0] if matching else b.fixed(size))
    return [*lead[::-1], left[-2], right[-1]]


@_rule("matmul", "mm", "bmm")
def _matmul(b: _Builder, node: Node) -> Any:
    left, right = b.dims(_a(node)[0]), b.dims(_a(node)[1])
    if left is None or right is None:
        return b.unfollowed(node)
    return _matmul_dims(b, node, left, right, (_a(node)[0], _a(node)[1]))


@_rule("addmm", "baddbmm", "addbmm")
def _addmm(b: _Builder, node: Node) -> Any:
    bias, left, right = b.dims(_a(node)[0]), b.dims(_a(node)[1]), b.dims(_a(node)[2])
    if left is None or right is None:
        return b.unfollowed(node)
    out = _matmul_dims(b, node, left, right, (_a(node)[1], _a(node)[2]))
    if bias is not None:
        for back in range(1, min(len(bias), len(out)) + 1):
            b.union(bias[-back], out[-back])
    return out


_STRIDE_BYTES = 16
"""torch's grouped matrix product wants every stride of its operands a multiple of this many bytes."""


@_rule("_grouped_mm", "grouped_mm", "grouped_mm_fallback")
def _grouped_mm(b: _Builder, node: Node) -> Any:
    """Rows of ``x`` grouped by expert, each group times its expert's matrix (transformers' fused experts).

    ``x`` (rows, in) with ``w`` (experts, in, out) gives (rows, out): ``in`` and
    ``out`` couple as in a matrix product, and position j of every expert goes
    together (the experts share one tensor, so each keeps the same width). The
    other layouts of torch's grouped product (offsets along a 2-D ``w``, or no
    offsets) are not followed.
    """
    left, right = b.dims(_a(node)[0]), b.dims(_a(node)[1])
    if left is None or right is None or len(left) != 2 or len(right) != 3 or len(_shape(node)) != 2:
        return b.unfollowed(node)
    b.positional(right, 0, node)
    b.ids.coupling = coupling(READS, b.module_name(node))
    b.union(left[1], right[1])
    value = node.meta.get("val")
    if isinstance(value, Tensor):
        per_stride = max(1, _STRIDE_BYTES // value.element_size())
        b.graph.aligned += [(left[1], per_stride), (right[2], per_stride)]
    _mark_producer(b, _a(node)[1], 2)
    _mark_producer(b, _a(node)[1], 1, reads=True)
    out = [left[0], right[2]]
    b.graph.macs.append(([*out, left[1]], 1))
    return out


@_rule("index")
def _index(b: _Builder, node: Node) -> Any:
    """``x[i, j]`` with integer index tensors: the dims indexed keep their positions, the others go through.

    As in numpy, index dims next to each other are replaced in place by the
    index's shape; apart, they come first. A boolean index is not followed.
    """
    dims = b.dims(_a(node)[0])
    indices = list(_a(node)[1]) if len(_a(node)) > 1 else []
    taken = [k for k, index in enumerate(indices) if index is not None]
    found = [indices[k].meta.get("val") if isinstance(indices[k], Node) else None for k in taken]
    values = [v for v in found if isinstance(v, Tensor) and not v.dtype.is_floating_point and v.dtype != torch.bool]
    if dims is None or not taken or len(indices) > len(dims) or len(values) != len(taken):
        return b.unfollowed(node)
    index_shape = torch.broadcast_shapes(*(v.shape for v in values))
    for k in taken:
        b.positional(dims, k, node)
    picked = [b.fixed(int(s)) for s in index_shape]
    if taken == list(range(taken[0], taken[-1] + 1)):
        out = [*dims[: taken[0]], *picked, *dims[taken[-1] + 1 :]]
    else:
        out = [*picked, *(ids for k, ids in enumerate(dims) if k not in taken)]
    if [int(ids.numel()) for ids in out] != list(_shape(node)):
        return b.unfollowed(node)
    return out


@_rule("linear")
def _linear(b: _Builder, node: Node) -> Any:
    x, weight = b.dims(_a(node)[0]), b.dims(_a(node)[1])
    bias = b.dims(_a(node)[2]) if len(_a(node)) > 2 else b.dims(_kw(node, "bias"))
    if x is None or weight is None:
        return b.unfollowed(node)
    b.ids.coupling = coupling(READS, b.module_name(node))
    b.union(x[-1], weight[1])
    if bias is not None:
        b.union(bias[0], weight[0])
    _mark_producer(b, _a(node)[1], 0)
    _mark_producer(b, _a(node)[1], 1, reads=True)
    out = [*x[:-1], weight[0]]
    b.graph.macs.append(([*out, x[-1]], 1))
    return out


_SAME_DIMS = frozenset(
    {"mul", "_to_copy", "to", "clone", "contiguous", "detach", "alias"}
    | {"split", "chunk", "split_with_sizes", "unsafe_split", "unsafe_chunk"}
)
"""Operations between a parameter and a layer that keep its dimensions (a pruning mask, a cast, q/k/v parts)."""


def _mark_producer(b: _Builder, arg: Any, dim: int, *, reads: bool = False) -> None:
    """Record that ``arg``'s dimension ``dim`` makes channels (``reads``: reads them, a layer's input columns).

    ``orig * mask``, casts and q/k/v parts are followed back to the parameter;
    through any other operation (a transpose, a weight standardized in the
    forward as timm's ``ScaledStdConv2d`` does), the search goes on to the first
    tensor whose dimension carries ``dim``'s very positions, and from there as
    before.
    """
    found = b.graph.consumers if reads else b.graph.producers
    carried = b.dims(arg)
    wanted = carried[dim] if carried is not None and dim < len(carried) else None
    seen: set[tuple[Node, int | None, bool]] = set()
    # a node; the dimension carrying ``dim``'s positions there (None: not found yet); whether only
    # dimension-keeping operations led there from ``arg``
    stack: list[tuple[Any, int | None, bool]] = [(arg, dim, True)]
    while stack and len(seen) < _MOST_FOLLOWED:
        current, at, direct = stack.pop()
        if not isinstance(current, Node) or (current, at, direct) in seen:
            continue
        seen.add((current, at, direct))
        if at is None and wanted is not None:
            at = _carrying(b, current, wanted)
        if current.op == "placeholder":
            target = getattr(b.input_specs.get(current.name), "target", None)
            if not isinstance(target, str) or target not in b.graph.tensors:
                continue
            if direct and len(_shape(current)) == len(_shape(arg)):
                found.add((target, dim))
            elif not direct and at is not None:
                found.add((target, at))
        elif current.op == "call_function":
            keeps = current.target is operator.getitem or _op_name(current.target) in _SAME_DIMS
            stack.extend((a, at if keeps else None, direct and keeps) for a in current.args if isinstance(a, Node))


def _carrying(b: _Builder, node: Node, wanted: IdArray) -> int | None:
    """The dimension of ``node``'s output whose ids are ``wanted`` (the same positions), if one is."""
    for index, ids in enumerate(b.dims(node) or ()):
        if ids.shape == wanted.shape and torch.equal(ids, wanted):
            return index
    return None


_MOST_FOLLOWED = 64
"""Most operations followed back from a layer's weight to its parameter: a weight's own computation is short."""


@_rule(
    "conv1d",
    "conv2d",
    "conv3d",
    "convolution",
    "_convolution",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
)
def _conv(b: _Builder, node: Node) -> Any:
    x, weight = b.dims(_a(node)[0]), b.dims(_a(node)[1])
    bias = b.dims(_a(node)[2]) if len(_a(node)) > 2 else None
    name = _op_name(node.target)
    if name in ("convolution", "_convolution"):
        transposed = bool(_a(node)[6])
        groups = int(_a(node)[8])
    elif name.startswith("conv_transpose"):
        transposed = True
        groups = int(_a(node)[6]) if len(_a(node)) > 6 else 1
    else:
        transposed = False
        groups = int(_a(node)[6]) if len(_a(node)) > 6 else int(_kw(node, "groups", 1))
    if x is None or weight is None or (transposed and groups != 1):
        return b.unfollowed(node)
    shape = _shape(node)
    spatial = len(weight) - 2
    batch = x[: len(x) - spatial - 1]
    channels = x[len(x) - spatial - 1]
    for k in range(2, len(weight)):  # kernel positions
        b.ids.pin(weight[k], "a convolution kernel keeps its size")
    for ids in x[len(x) - spatial :]:  # the output's positions come from these: they keep them
        b.ids.pin(ids, f"{_op_text(node)} in {b.module_name(node)} slides over these positions")
    out_spatial = [b.fixed(s, "spatial positions") for s in shape[len(shape) - spatial :]]
    b.ids.coupling = coupling(READS, b.module_name(node))
    if transposed:
        b.union(channels, weight[0])
        out_channels = weight[1]
        _mark_producer(b, _a(node)[1], 1)
        _mark_producer(b, _a(node)[1], 0, reads=True)
    elif groups == 1:
        b.union(channels, weight[1])
        out_channels = weight[0]
        _mark_producer(b, _a(node)[1], 0)
        _mark_producer(b, _a(node)[1], 1, reads=True)
    elif b.grouped == "inside" and channels.numel() // groups > 1:
        # grouped, channels inside groups: position j of every group goes together (each group keeps its width)
        per_in, per_out = channels.numel() // groups, weight[0].numel() // groups
        b.ids.coupling = coupling("the grouped convolution", b.module_name(node))
        for g in range(1, groups):
            b.union(channels[g * per_in : (g + 1) * per_in], channels[:per_in])
            b.union(weight[0][g * per_out : (g + 1) * per_out], weight[0][:per_out])
        b.ids.coupling = coupling(READS, b.module_name(node))
        b.union(channels[:per_in], weight[1])
        out_channels = weight[0]
        _mark_producer(b, _a(node)[1], 0)
        _mark_producer(b, _a(node)[1], 1, reads=True)
    else:
        # grouped or depthwise: each group's input and output channels go together, whole groups at a time
        per_in, per_out = channels.numel() // groups, weight[0].numel() // groups
        kind = "the depthwise convolution" if per_in == 1 else "the grouped convolution"
        b.ids.coupling = coupling(kind, b.module_name(node))
        b.ids.pin(weight[1], "a grouped convolution keeps its channels per group")
        # per group, its input and output channels in one class: the first coupled with each of the others,
        # every group in one call (a depthwise convolution has as many groups as channels)
        members = torch.cat([channels.reshape(groups, per_in), weight[0].reshape(groups, per_out)], dim=1)
        if members.shape[1] > 1:
            b.ids.union_arrays(members[:, :1].expand(-1, members.shape[1] - 1), members[:, 1:])
        out_channels = weight[0]
        _mark_producer(b, _a(node)[1], 0)
        b.graph.conv_groups[_module_path(node)] = per_out
    if bias is not None:
        b.union(bias[0], out_channels)
    out = [*batch, out_channels, *out_spatial]
    b.graph.macs.append(([*out, weight[1] if not transposed else weight[0]], math.prod(_shape(_a(node)[1])[2:])))
    return out


_VIEWS = frozenset({"view", "reshape", "_unsafe_view"})


def _sizes_from_input(node: Node) -> frozenset[int]:
    """The output dimensions of ``node`` sized by its input's shape (see :attr:`NodeDims.from_input`)."""
    if node.meta.get("sizes_from_input"):
        return frozenset(range(len(_shape(node))))
    packet = getattr(node.target, "overloadpacket", None)
    if packet is None or packet.__name__ not in _VIEWS or len(node.args) < 2:
        return frozenset()
    sizes = node.args[1]
    if not isinstance(sizes, (list, tuple)):
        return frozenset()
    return frozenset(i for i, size in enumerate(sizes) if size == -1)


def _module_path(node: Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return str(list(stack.values())[-1][0]) if stack else ""


@_rule(
    "batch_norm",
    "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit",
    "native_batch_norm",
    "_native_batch_norm_legit_functional",
    "instance_norm",
    "cudnn_batch_norm",
)
def _batch_norm(b: _Builder, node: Node) -> Any:
    x = b.dims(_a(node)[0])
    if x is None:
        return b.unfollowed(node)
    channels = x[1] if len(x) > 1 else x[0]
    for arg in _a(node)[1:5]:
        stats = b.dims(arg)
        if stats is not None and len(stats) == 1:
            b.union(stats[0], channels)
    value = node.meta.get("val")
    if isinstance(value, (tuple, list)):  # a batch's mean and inverse deviation are per channel; in eval, empty
        rest = b.fresh_like(node, None)[1:]
        per_channel = (channels.numel(),)
        return [list(x), *([channels] if _shape_of(v) == per_channel else r for v, r in zip(value[1:], rest))]
    return list(x)


@_rule("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm")
def _layer_norm(b: _Builder, node: Node) -> Any:
    x = b.dims(_a(node)[0])
    if x is None:
        return b.unfollowed(node)
    normalized = len(_a(node)[1])
    for arg in _a(node)[2:4]:
        param = b.dims(arg)
        if param is not None:
            for k in range(1, normalized + 1):
                b.union(param[-k], x[-k])
    value = node.meta.get("val")
    if isinstance(value, (tuple, list)):
        return [list(x), *b.fresh_like(node, None)[1:]]
    return list(x)


@_rule("prelu")
def _prelu(b: _Builder, node: Node) -> Any:
    """PReLU's weight: one slope per channel (dimension 1 of the input) goes with it, as a norm's; one shared stays."""
    x, weight = b.dims(_a(node)[0]), b.dims(_a(node)[1])
    if x is None or weight is None or len(weight) != 1:
        return b.unfollowed(node)
    if weight[0].numel() > 1:
        if len(x) < 2 or x[1].numel() != weight[0].numel():
            return b.unfollowed(node)
        b.union(weight[0], x[1])
    return list(x)


@_rule("group_norm", "native_group_norm")
def _group_norm(b: _Builder, node: Node) -> Any:
    x = b.dims(_a(node)[0])
    if x is None:
        return b.unfollowed(node)
    name = _op_name(node.target)
    if name == "group_norm":
        groups, params = int(_a(node)[1]), _a(node)[2:4]
    else:
        groups, params = int(_a(node)[6]), _a(node)[1:3]
    channels = x[1]
    per = channels.numel() // groups
    for arg in params:
        param = b.dims(arg)
        if param is not None:
            b.union(param[0], channels)
    for g in range(groups):  # whole groups go, so that every group keeps its size
        b.ids.union_all(channels[g * per : (g + 1) * per])
    b.graph.norm_groups[_module_path(node)] = per
    value = node.meta.get("val")
    if isinstance(value, (tuple, list)):
        return [list(x), *b.fresh_like(node, None)[1:]]
    return list(x)


@_rule("embedding")
def _embedding(b: _Builder, node: Node) -> Any:
    weight, indices = b.dims(_a(node)[0]), b.dims(_a(node)[1])
    if weight is None or indices is None:
        return b.unfollowed(node)
    b.ids.pin(weight[0], "an embedding's rows are looked up by index")
    _mark_producer(b, _a(node)[0], 1)
    return [*indices, weight[1]]


@_rule(
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
)
def _attention(b: _Builder, node: Node) -> Any:
    q, k, v = (b.dims(a) for a in _a(node)[:3])
    if q is None or k is None or v is None:
        return b.unfollowed(node)
    b.union(q[-1], k[-1])
    b.union(k[-2], v[-2])
    for back in range(3, min(len(q), len(k), len(v)) + 1):
        b.union(k[-back], v[-back])
        if q[-back].numel() == k[-back].numel():
            b.union(q[-back], k[-back])
        elif back == 3 and q[-back].numel() % k[-back].numel() == 0:  # grouped KV heads
            repeat = q[-back].numel() // k[-back].numel()
            for g in range(k[-back].numel()):
                b.ids.union_all(torch.cat([q[-back][g * repeat : (g + 1) * repeat], k[-back][g : g + 1]]))
    b.graph.macs.append(([*q[:-1], k[-2], q[-1]], 1))  # scores
    b.graph.macs.append(([*q[:-1], v[-1], k[-2]], 1))  # scores @ values
    mask = _a(node)[3] if len(_a(node)) > 3 else _kw(node, "attn_mask")
    mask_dims = b.dims(mask)
    out = [*q[:-1], v[-1]]
    if mask_dims is not None:
        scores = [*q[:-1], k[-2]]
        for back in range(1, min(len(mask_dims), len(scores)) + 1):
            if mask_dims[-back].numel() == scores[-back].numel():
                b.union(mask_dims[-back], scores[-back])
    value = node.meta.get("val")
    if isinstance(value, (tuple, list)):
        return [out, *b.fresh_like(node, None)[1:]]
    return out


@_rule(
    "mean",
    "sum",
    "amax",
    "amin",
    "var",
    "std",
    "logsumexp",
    "norm",
    "linalg_vector_norm",
    "prod",
    "any",
    "all",
    "var_mean",
    "max",
    "min",
)
def _reduce(b: _Builder, node: Node) -> Any:
    dims = b.dims(_a(node)[0])
    if dims is None:
        return b.unfollowed(node)
    value = node.meta.get("val")
    out_shape = _shape_of(value[0] if isinstance(value, (tuple, list)) else value)
    ndim = len(dims)
    reduced = _reduced_dims(node, ndim)
    if _op_name(node.target) in ("max", "min") and isinstance(value, (tuple, list)):
        for d in reduced:  # indices of the largest: positions
            b.positional(dims, d, node)
    kept = [ids for k, ids in enumerate(dims) if k not in reduced]
    if len(out_shape) == ndim:  # keepdim
        out = [ids if k not in reduced else b.fixed(out_shape[k]) for k, ids in enumerate(dims)]
    elif [ids.numel() for ids in kept] == list(out_shape):
        out = kept
    else:
        out = [b.fixed(s) for s in out_shape]
    if isinstance(value, (tuple, list)):
        return [out, *[list(out) for _ in value[1:]]]
    return out


def _reduced_dims(node: Node, ndim: int) -> list[int]:
    name = _op_name(node.target)
    dim_arg = _kw(node, "dim")
    if dim_arg is None and len(_a(node)) > 1:
        candidate = _a(node)[2] if name in ("norm", "linalg_vector_norm") and len(_a(node)) > 2 else _a(node)[1]
        if isinstance(candidate, (int, list, tuple)) and not isinstance(candidate, bool):
            dim_arg = candidate
    if dim_arg is None or dim_arg == []:
        return list(range(ndim))
    if isinstance(dim_arg, int):
        return [_dim(dim_arg, ndim)]
    return [_dim(int(d), ndim) for d in dim_arg]


@_rule(
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
    "max_pool2d_with_indices",
    "max_pool3d_with_indices",
    "upsample_nearest1d",
    "upsample_nearest2d",
    "upsample_nearest3d",
    "upsample_bilinear2d",
    "upsample_bicubic2d",
    "upsample_linear1d",
    "upsample_trilinear3d",
    "_adaptive_avg_pool2d",
    "_upsample_nearest_exact2d",
    "constant_pad_nd",
    "pad",
    "reflection_pad2d",
    "replication_pad2d",
)
def _spatial(b: _Builder, node: Node) -> Any:
    """Pooling, resizing, padding: the leading (batch, channel) dimensions pass, the spatial ones are new."""
    dims = b.dims(_a(node)[0])
    if dims is None:
        return b.unfollowed(node)
    name = _op_name(node.target)
    value = node.meta.get("val")
    shape = _shape_of(value[0] if isinstance(value, (tuple, list)) else value)
    pads = list(_a(node)[1]) if name in ("constant_pad_nd", "pad", "reflection_pad2d", "replication_pad2d") else None
    spatial = len(pads) // 2 if pads is not None else next((int(c) for c in "321" if c + "d" in name), 2)
    out = list(dims[: len(dims) - spatial])
    for k in range(len(dims) - spatial, len(dims)):
        if pads is not None and pads[2 * (len(dims) - 1 - k)] == 0 == pads[2 * (len(dims) - 1 - k) + 1]:
            out.append(dims[k])  # not padded: its positions pass (Swin pads the channels by nothing)
            continue
        # a new size made from this dimension's positions: it keeps them (an image's, always)
        b.ids.pin(dims[k], f"{_op_text(node)} in {b.module_name(node)} works on dimension {k} by position")
        out.append(b.fixed(shape[k], "spatial positions"))
    if isinstance(value, (tuple, list)):
        return [out, *[list(out) for _ in value[1:]]]
    return out


@_rule("einsum")
def _einsum(b: _Builder, node: Node) -> Any:
    equation = str(_a(node)[0]).replace(" ", "")
    operands = [d for d in (b.dims(t) for t in _a(node)[1]) if d is not None]
    if "..." in equation or "->" not in equation or len(operands) != len(_a(node)[1]):
        return b.unfollowed(node)
    inputs, output = equation.split("->")
    letters: dict[str, IdArray] = {}
    for spec, dims in zip(inputs.split(","), operands, strict=True):
        for letter, ids in zip(spec, dims, strict=True):
            if letter in letters and letters[letter].numel() == ids.numel():
                b.union(letters[letter], ids)
            elif letter not in letters or ids.numel() > letters[letter].numel():
                letters[letter] = ids
    return [letters[letter] for letter in output]


@_rule(
    "sym_size",
    "sym_numel",
    "sym_stride",
    "_assert_scalar",
    "sym_constrain_range_for_size",
    "_set_grad_enabled",
    "scalar_tensor",
    "arange",
    "zeros",
    "ones",
    "full",
    "empty",
    "rand",
    "randn",
    "tensor",
    "_assert_async",
    "eye",
)
def _no_channels(b: _Builder, node: Node) -> Any:
    return b.fresh_like(node, None)
