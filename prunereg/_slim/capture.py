"""The ATen graph of one eager forward: slimming's fast capture, beside ``torch.export``.

``torch.export`` traces with fake tensors through torch's general tracer (about
a millisecond of Python per operation, and its first call in a process imports
the compiler, over a second); slimming reads only which operation ran on which
tensors, their shapes and the module running it. This runs the model once, for
real, under no_grad and a dispatch mode that writes each ATen operation into a
:class:`torch.fx.Graph` shaped like export's (placeholders for parameters,
buffers, constants and inputs, named in a signature; ``meta["val"]`` a meta
tensor of the output's shape; ``meta["nn_module_stack"]`` the modules running
it), so :mod:`prunereg._slim.graph` reads either.

The dispatch mode sees operations after autograd, where torch has already
split composite ones (``linear`` into a transpose and a matrix product). The
few whose meaning slimming reads whole are caught one level up, as torch
functions, and recorded as the one ATen operation export shows: see
:data:`_WHOLE`. A model on the meta device has no values for code that asks
for them (transformers' masks): it goes through ``torch.export``.
"""

from __future__ import annotations

import operator
import types as python_types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from prunereg._core.reparam import PruningHook, forget_pruned_tensor


class Captured(Protocol):
    """What slimming reads of a capture: ``torch.export.ExportedProgram`` and :class:`EagerCapture` both have it."""

    @property
    def graph(self) -> torch.fx.Graph: ...

    @property
    def graph_signature(self) -> ExportGraphSignature: ...


@dataclass
class EagerCapture:
    """The graph of one eager forward, in export's form (:class:`Captured`)."""

    graph: torch.fx.Graph
    graph_signature: ExportGraphSignature
    not_export: str | None
    """Why the graph may not be export's, if so: an operation read tensor values (``.item()``, a boolean index:
    a branch may hang on them), or a Python torch function split an operation export keeps whole."""


Arrange = Callable[..., tuple[Any, ...]]


def _in_order(op: torch._ops.OpOverload) -> Arrange:
    """The arguments of a call of ``op``'s torch function as ``op``'s schema lists them, defaults filled in."""
    schema = [(argument.name, argument.default_value if argument.has_default_value() else None)
              for argument in op._schema.arguments]  # fmt: skip

    def arrange(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return (*args, *(kwargs.get(name, default) for name, default in schema[len(args) :]))

    return arrange


def _swapped(input: Tensor, other: Tensor) -> tuple[Any, ...]:
    return (other, input)


def _instance_norm(
    input: Tensor,
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[Any, ...]:
    """``F.instance_norm``'s arguments in ATen's order."""
    return (input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps, False)


def _reshape(input: Tensor, *shape: Any) -> tuple[Any, ...]:
    sizes = shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else shape
    return (input, list(sizes))


def _einsum(equation: str, *operands: Any) -> tuple[Any, ...]:
    tensors = operands[0] if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else operands
    return (equation, list(tensors))


def _whole(op: torch._ops.OpOverload, *functions: Callable[..., Any]) -> dict[Callable[..., Any], tuple[Any, Arrange]]:
    return {function: (op, _in_order(op)) for function in functions}


aten = torch.ops.aten
_WHOLE: dict[Callable[..., Any], tuple[torch._ops.OpOverload, Arrange]] = {
    **_whole(aten.linear.default, torch._C._nn.linear),
    **_whole(aten.matmul.default, torch.matmul, Tensor.matmul, Tensor.__matmul__),
    Tensor.__rmatmul__: (aten.matmul.default, _swapped),
    **_whole(aten.scaled_dot_product_attention.default, torch._C._nn.scaled_dot_product_attention),
    torch.einsum: (aten.einsum.default, _einsum),
    torch.reshape: (aten.reshape.default, _reshape),
    Tensor.reshape: (aten.reshape.default, _reshape),
    **_whole(aten.prelu.default, torch.prelu),
    **_whole(aten.rms_norm.default, torch.rms_norm, F.rms_norm),
    **_whole(aten.instance_norm.default, torch.instance_norm),
    F.instance_norm: (aten.instance_norm.default, _instance_norm),
    **_whole(aten.adaptive_avg_pool1d.default, torch.adaptive_avg_pool1d, F.adaptive_avg_pool1d),
    **_whole(aten.adaptive_avg_pool2d.default, torch._C._nn.adaptive_avg_pool2d, F.adaptive_avg_pool2d),
    **_whole(aten.adaptive_avg_pool3d.default, torch._C._nn.adaptive_avg_pool3d, F.adaptive_avg_pool3d),
}
"""Composite torch functions recorded whole, as export shows them: function to (ATen op, its arguments in order).

Python functions of ``torch.nn.functional`` that call one of these are listed too: the function mode sees the
outermost torch function only."""


_SIZES_FROM_INPUT = frozenset({torch.flatten, Tensor.flatten})
"""Torch functions whose ATen view gets sizes computed from the input's shape, never written in the model's code:
their nodes are marked ``sizes_from_input`` (a slimmed model's check need not capture it again for them)."""


class _Recorder:
    """The graph being written: tensors seen so far and the node each one is, the module stack."""

    def __init__(self) -> None:
        self.graph = torch.fx.Graph()
        self.nodes: dict[int, tuple[weakref.ref[Tensor], torch.fx.Node]] = {}
        self.specs: list[InputSpec] = []
        self.modules: list[tuple[str, str]] = []
        self.constants = 0
        self.inside_whole = 0
        self.inside_python = 0
        self.sizes_from_input = 0
        self.split: str | None = None
        """What makes this graph not export's, always: a composite operation export keeps whole split where the
        function mode could not see it, or a shape made from values (export refuses it, naming it)."""
        self.read: str | None = None
        """The first operation that handed tensor values to Python."""
        self.parameters: dict[int, list[torch.fx.Node]] = {}
        """Per parameter (by identity), its placeholders: one per name it is held under."""

    def where(self) -> str:
        """`` in 'path'``: the module running now, for a message (nothing outside every module)."""
        return f" in '{self.modules[-1][0]}'" if self.modules and self.modules[-1][0] else ""

    def placeholder(
        self, tensor: Tensor, kind: InputKind, target: str | None, name: str, persistent: bool | None = None
    ) -> torch.fx.Node:
        node = self.graph.placeholder(name)
        node.meta["val"] = _meta(tensor)
        spec = InputSpec(kind=kind, arg=TensorArgument(name=node.name), target=target, persistent=persistent)
        self.specs.append(spec)
        self._remember(tensor, node)
        return node

    def _remember(self, tensor: Tensor, node: torch.fx.Node) -> None:
        self.nodes[id(tensor)] = (weakref.ref(tensor), node)

    def node_of(self, tensor: Tensor) -> torch.fx.Node:
        entry = self.nodes.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            return entry[1]
        self.constants += 1
        return self.placeholder(tensor, InputKind.CONSTANT_TENSOR, f"_constant{self.constants}", "c_constant")

    def argument(self, value: Any) -> Any:
        """``value`` with each tensor in it replaced by its node (an operation's arguments: tuples, lists, dicts).

        By hand rather than by pytree's ``tree_map``: it runs for every operation
        captured, and pytree's generality costs several times more.
        """
        if isinstance(value, Tensor):
            return self.node_of(value)
        kind = type(value)
        if kind is tuple or kind is list:
            return kind(self.argument(item) for item in value)
        if kind is dict:
            return {key: self.argument(item) for key, item in value.items()}
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
            return kind(*(self.argument(item) for item in value))
        return value

    def record(self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        node = self.graph.call_function(op, self.argument(args), self.argument(kwargs))
        node.meta["nn_module_stack"] = {f"L__{i}": entry for i, entry in enumerate(self.modules)}
        if self.sizes_from_input:
            node.meta["sizes_from_input"] = True
        if isinstance(out, Tensor):
            node.meta["val"] = _meta(out)
            self._remember(out, node)
        elif isinstance(out, (tuple, list)):
            node.meta["val"] = [_meta(item) if isinstance(item, Tensor) else item for item in out]
            for index, item in enumerate(out):
                if isinstance(item, Tensor):
                    part = self.graph.call_function(operator.getitem, (node, index))
                    part.meta["val"] = _meta(item)
                    part.meta["nn_module_stack"] = node.meta["nn_module_stack"]
                    self._remember(item, part)


_READS_VALUES = frozenset({"_local_scalar_dense", "is_nonzero", "equal"})
"""Operations handing tensor values to Python (``.item()``, ``bool(tensor)``, ``torch.equal``)."""

_SHAPE_FROM_VALUES = frozenset(
    {"nonzero", "nonzero_static", "masked_select", "unique_dim", "_unique", "_unique2", "unique_consecutive"}
    | {"bincount", "repeat_interleave"}
)
"""Operations making a shape from tensor values: export refuses them by name, which slimming keeps."""


_SPLIT_FROM_WHOLE = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_attention_math",
    }
    | {
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    }
)
"""What the operations of :data:`_WHOLE` split into: inside a Python torch function (which hides the whole ones
from the function mode, as ``F.multi_head_attention_forward`` does), a sign that the graph is not export's."""


def _shape_from_values(name: str, args: tuple[Any, ...]) -> bool:
    if name in _SHAPE_FROM_VALUES:
        return True
    if name in ("index", "index_put", "index_put_") and len(args) > 1:  # a boolean index selects by value
        return any(isinstance(index, Tensor) and index.dtype in (torch.bool, torch.uint8) for index in args[1] or ())
    return False


def _meta(tensor: Tensor) -> Tensor:
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")


class _AtenMode(TorchDispatchMode):
    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ to keep its compiler out, importing the compiler (over a second)
        # on the first call; nothing here is compiled.
        return False

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        recorder = self.recorder
        name = func.overloadpacket.__name__
        if recorder.read is None and name in _READS_VALUES:
            recorder.read = f"aten.{name}{recorder.where()} reads tensor values"
        if recorder.split is None and _shape_from_values(name, args):
            recorder.split = f"aten.{name}{recorder.where()} makes a shape from tensor values"
        elif recorder.split is None and not recorder.inside_whole:
            if recorder.inside_python and name in _SPLIT_FROM_WHOLE:
                recorder.split = f"aten.{name} is part of a composite operation a torch function split"
            elif name in ("as_strided", "as_strided_"):
                recorder.split = f"aten.{name} restrides a tensor (a composite operation split)"
        if not recorder.inside_whole:
            recorder.record(func, args, kwargs or {}, out)
        return out


class _WholeMode(TorchFunctionMode):
    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        whole = _WHOLE.get(func)
        if whole is None or self.recorder.inside_whole:
            python = isinstance(func, python_types.FunctionType)  # its body runs with this mode off: whole ones unseen
            from_input = func in _SIZES_FROM_INPUT
            self.recorder.inside_python += python
            self.recorder.sizes_from_input += from_input
            try:
                return func(*args, **kwargs)
            finally:
                self.recorder.inside_python -= python
                self.recorder.sizes_from_input -= from_input
        op, arrange = whole
        self.recorder.inside_whole += 1  # neither its parts nor the meta tensors of its record are recorded
        try:
            out = func(*args, **kwargs)
            self.recorder.record(op, arrange(*args, **kwargs), {}, out)
        finally:
            self.recorder.inside_whole -= 1
        return out


def _qualified(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def capture(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> EagerCapture:
    """The ATen graph of ``model(*args, **kwargs)``, run once under no_grad, in export's form."""
    recorder = _Recorder()
    for module in model.modules():
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, PruningHook):
                forget_pruned_tensor(hook)
    saved = model.state_dict(keep_vars=True)
    for kind, named in ((InputKind.PARAMETER, model.named_parameters), (InputKind.BUFFER, model.named_buffers)):
        # a tied tensor under each of its names, every use read as the last one's, as export has it
        for name, tensor in named(remove_duplicate=False):
            prefix, persistent = ("p_", None) if kind == InputKind.PARAMETER else ("b_", name in saved)
            node = recorder.placeholder(tensor, kind, name, prefix + name.replace(".", "_"), persistent)
            if kind == InputKind.PARAMETER:
                recorder.parameters.setdefault(id(tensor), []).append(node)
    for index, leaf in enumerate(tree_flatten((args, kwargs))[0]):
        if isinstance(leaf, Tensor) and recorder.nodes.get(id(leaf), (lambda: None, None))[0]() is not leaf:
            recorder.placeholder(leaf, InputKind.USER_INPUT, None, f"input_{index}")
    with _ModuleStack(model, recorder), torch.no_grad(), _WholeMode(recorder), _AtenMode(recorder):
        out = model(*args, **kwargs)
    outputs = [recorder.node_of(leaf) for leaf in tree_flatten(out)[0] if isinstance(leaf, Tensor)]
    recorder.graph.output(tuple(outputs))
    output_specs = [
        OutputSpec(kind=OutputKind.USER_OUTPUT, arg=TensorArgument(name=n.name), target=None) for n in outputs
    ]
    return EagerCapture(recorder.graph, ExportGraphSignature(recorder.specs, output_specs), _not_export(recorder))


def _not_export(recorder: _Recorder) -> str | None:
    """Why the graph may not be the one export would give (then slimming exports), or ``None``.

    Reading values is harmless where every parameter took part: a branch the
    example inputs did not take could hold no layer the plan has not seen (a
    transformers mask checks ``.all()`` of its positions, and every layer runs).
    """
    if recorder.split is not None:
        return recorder.split
    if recorder.read is None:
        return None
    targets = {spec.arg.name: spec.target for spec in recorder.specs if isinstance(spec.arg, TensorArgument)}
    unused = [targets[nodes[0].name] for nodes in recorder.parameters.values() if not any(n.users for n in nodes)]
    return f"{recorder.read}, and '{unused[0]}' took no part: a branch may hold it" if unused else None


class _ModuleStack:
    """Hooks on every module of ``model`` keeping ``recorder.modules`` the stack of modules running.

    A module is named by the way it was reached, as export names it: the
    running module's attribute holding it (a module shared by several blocks
    gets each block's path), else its first name in ``model``.
    """

    def __init__(self, model: nn.Module, recorder: _Recorder) -> None:
        self.model, self.recorder = model, recorder
        self.handles: list[Any] = []
        self.running: list[nn.Module] = []

    def __enter__(self) -> None:
        self.first_names = {id(module): name for name, module in self.model.named_modules()}
        for module in self.model.modules():
            if module is not self.model:  # export's stack leaves the model itself out
                self.handles.append(module.register_forward_pre_hook(self._enter, prepend=True))
                self.handles.append(module.register_forward_hook(self._leave, always_call=True))

    def _enter(self, module: nn.Module, inputs: Any) -> None:
        parent = self.running[-1] if self.running else self.model
        parent_path = self.recorder.modules[-1][0] if self.running else ""
        key = next((key for key, child in parent._modules.items() if child is module), None)
        path = (f"{parent_path}.{key}" if parent_path else key) if key is not None else self.first_names[id(module)]
        self.running.append(module)
        self.recorder.modules.append((path, _qualified(module)))

    def _leave(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if self.running and self.running[-1] is module:
            self.running.pop()
            self.recorder.modules.pop()

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.running.clear()
        self.recorder.modules.clear()
