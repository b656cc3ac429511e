"""One pass of slimming: plan, cut, and check that the slimmed model computes what the plan says.

:func:`attempt` builds the graph (with some modules kept whole), chooses the
units to remove, cuts, sets the width attributes (:mod:`.rules`), and checks:

- the slimmed model runs on the example inputs and keeps its output shapes;
- every operation makes the shape the plan says (:mod:`.verify`), so a module
  that computes a size from somewhere the graph cannot see is caught;
- without a ratio, the outputs are those of the model with the removed units'
  entries set to zero, and (else a warning) those of the masked model.

A check that fails gives a :class:`Failure` (the caller puts the model back);
:class:`Fallback` decides whether to try again another way (exact zeros
kept, a module class kept whole) or to refuse.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._models import slimmed as shapes
from prunereg._models.slimmed import Record
from prunereg._slim.capture import Captured
from prunereg._slim.cut import cut
from prunereg._slim.graph import DependencyGraph, SlimError, build_graph, capture_like, leaves_no_state
from prunereg._slim.groups import Chosen, Group, TensorDim, find_groups, kept_positions
from prunereg._slim.report import TensorChange
from prunereg._slim.rules import HEAD_WIDTHS, sync_width_attributes
from prunereg._slim.verify import compare, needs_capture, planned_shapes
from prunereg._slim.widths import width_readers

MOST_KEPT_WHOLE = 8
"""How many times a ratio may keep a failing module (and its class) whole and try again, before slimming refuses."""


Chooser = Callable[[list[Group], DependencyGraph, dict[str, Tensor], bool], Chosen]
"""``(groups, graph, parameter values, exact zeros may go)`` to the units to remove."""


@dataclass
class Slimmed:
    """A slimmed model that computes what its plan says."""

    groups: list[Group]
    removed: dict[int, set[int]]
    changes: list[TensorChange]
    params: tuple[int, int]
    macs: tuple[int, int]
    notes: list[str]
    outputs: list[Tensor]
    before: Record
    """The shapes before the cut (:func:`prunereg.slimmed_shapes`' record)."""
    keep: dict[TensorDim, Tensor]
    """Per tensor dimension that lost positions, the sorted positions it kept."""


@dataclass
class Failure:
    """Why a slimmed model is not what its plan says."""

    what: str
    way: str = ""
    """What the user can do about it (for a refusal)."""
    module: str | None = None
    """The module that computed something else than the plan (to keep whole and try again)."""
    zeros: bool = False
    """Units only exact zeros chose were removed (to keep and try again)."""
    cause: BaseException | None = None

    @property
    def message(self) -> str:
        return f"{self.what}: {self.way}" if self.way else self.what


def attempt(
    model: nn.Module,
    inputs: tuple[tuple[Any, ...], dict[str, Any]],
    exported: Captured,
    pinned: list[str],
    choose: Chooser,
    *,
    zeros: bool,
    masked: bool,
    on_meta: bool,
    grouped: str,
) -> Slimmed | Failure:
    """Plan with the modules ``pinned`` kept whole, cut, and check; ``masked``: a plan from the masks (no ratio).

    ``grouped``: how grouped convolutions lose channels (:data:`~prunereg._slim.graph.GROUPED`).
    """
    graph = build_graph(model, exported, pinned, grouped)
    groups = find_groups(graph, every=masked)
    values = parameter_values(model, graph)
    chosen = choose(groups, graph, values, zeros)
    keep = kept_positions(groups, chosen.removed)
    gone = {groups[g].units[k] for g, units in chosen.removed.items() for k in units}
    macs = (graph.count_macs(), graph.count_macs(gone))
    params_before, outputs_before = parameter_count(model), _shapes(exported_outputs(exported))
    reference = equivalent = None
    if masked and keep:
        reference = tensors(forward(model, *inputs))
        equivalent = _zeroed_outputs(model, keep, inputs)
    before = shapes.snapshot(model)
    # nothing is cut before this line
    changes, touched = cut(model, graph, keep)
    sync_width_attributes(model, graph, gone, touched)
    widths = _changed_widths(changes, groups, chosen.removed)
    planned = planned_shapes(graph, gone)
    try:
        if on_meta:  # its code may ask for values (transformers' masks call .all()): traced, not run
            after: Captured | None = capture_like(model, *inputs, exported)
            assert after is not None
            outputs = exported_outputs(after)
        else:
            outputs = tensors(forward(model, *inputs))
            after = capture_like(model, *inputs, exported) if needs_capture(graph, planned) else None
    except Exception as error:  # any failure of the slimmed model is reported, the model put back
        return _failed(error, model, widths, bool(chosen.by_zeros))
    if _shapes(outputs) != outputs_before:
        return Failure(f"slimming would change the model's output shapes {outputs_before} to {_shapes(outputs)}")
    mismatch = compare(graph, planned, after) if after is not None else None
    if mismatch is not None:
        return _not_planned(model, mismatch.module, mismatch.message, widths, bool(chosen.by_zeros))
    notes = list(chosen.notes)
    if reference is not None and equivalent is not None:
        failure = _compare_outputs(reference, equivalent, outputs, bool(chosen.by_zeros), notes)
        if failure is not None:
            return failure
    return Slimmed(groups, chosen.removed, changes, (params_before, parameter_count(model)), macs, notes, outputs,
                   before, keep)  # fmt: skip


class Fallback:
    """What to try after a :class:`Failure`: exact zeros kept, then (with a ratio) the failing module class whole.

    Every module of the failing class is kept whole at once, as the same code
    would fail in each; a layer of torch's own is kept whole alone.
    """

    def __init__(self, model: nn.Module, by_ratio: bool) -> None:
        self.model = model
        self.by_ratio = by_ratio
        self.zeros = True
        self.kept: list[str] = []
        self.tries = 0
        self.notes: list[str] = []

    def take(self, failure: Failure) -> None:
        """Change what the next attempt does, or raise the failure as a :class:`SlimError`."""
        if failure.zeros and self.zeros:
            self.zeros = False
            self.notes.append(f"exact zeros stay: removing them would change the outputs ({failure.what})")
            return
        if self.by_ratio and failure.module and self.tries < MOST_KEPT_WHOLE:
            cls = type(self.model.get_submodule(failure.module))
            names = [name for name, module in self.model.named_modules() if type(module) is cls and name]
            if cls.__module__.startswith("torch.nn."):  # torch's own layer failed for the code around it: that one
                names = [failure.module]
            if failure.module not in self.kept:
                self.tries += 1
                self.kept += names
                more = f" and {len(names) - 1} more {cls.__name__}" if len(names) > 1 else ""
                note = (
                    f"kept '{failure.module}'{more} whole: {failure.what}; "
                    f"prunereg.register_width_rule({cls.__name__}, ...) can say how it slims"
                )
                self.notes.append(note)
                warnings.warn(note, UserWarning, stacklevel=4)
                return
        raise SlimError(failure.message) from failure.cause


def _failed(error: BaseException, model: nn.Module, widths: set[int], zeros: bool) -> Failure:
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
    failed = f"the slimmed model fails on the example inputs ({type(error).__name__}: {first_line})"
    module, read = width_readers(error, model, widths)
    if read:
        said = " and ".join(f"self.{name} ({value})" for name, value in read.items())
        what = (
            f"{failed}: '{module}' reads {said}, {'a width' if len(read) == 1 else 'widths'} slimming changed but "
            "cannot set there"
        )
        return Failure(what, f"pass ignore=['{module}'] to keep that module whole", module, zeros, error)
    what = f"{failed}; a module reads a width from somewhere slimming does not know"
    return Failure(what, "pass it (or its parent) in ignore=", _innermost_module(error, model), zeros, error)


def _innermost_module(error: BaseException, model: nn.Module) -> str | None:
    """The innermost submodule of ``model`` whose code the traceback of ``error`` runs through."""
    import traceback

    names = {id(module): name for name, module in model.named_modules() if name}
    for frame, _ in reversed(list(traceback.walk_tb(error.__traceback__))):
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in names:
            return names[id(owner)]
    return None


def _not_planned(model: nn.Module, module: str, mismatch: str, widths: set[int], zeros: bool) -> Failure:
    """A slimmed model one of whose operations does not make what the plan says: what it holds, and the way around."""
    said = ""
    if module:
        owner = model.get_submodule(module)
        read = {
            name: value for name, value in vars(owner).items()
            if isinstance(value, int) and not isinstance(value, bool) and value in widths and name not in HEAD_WIDTHS
        }  # fmt: skip
        if read:
            said = " (it holds " + " and ".join(f"self.{name} = {value}" for name, value in read.items()) + ")"
    what = (
        f"the slimmed model would compute something else than planned: {mismatch}; it computes a size from "
        f"somewhere slimming does not set{said}"
    )
    way = f"pass ignore=['{module}'] to keep that module whole" if module else "name its modules in ignore="
    return Failure(what, f"{way}, or register a width rule for it", module or None, zeros)


def _compare_outputs(
    reference: list[Tensor], equivalent: list[Tensor], outputs: list[Tensor], zeros: bool, notes: list[str]
) -> Failure | None:
    """Without a ratio: the slimmed outputs must be those of the model with the removed entries zeroed."""
    worst = _difference(equivalent, outputs)
    if worst is not None:
        return Failure(
            f"removing the pruned channels changes the outputs by up to {worst:.3g} from those of the same model "
            "with their entries at zero: an operation counts them (a LayerNorm's statistics, a mean over channels)",
            "prune channels that no such operation reads, or none",
            zeros=zeros,
        )
    worst = _difference(reference, equivalent)
    if worst is None:
        return None
    if zeros:
        return Failure(f"their biases or norms' shifts move the outputs by up to {worst:.3g}", zeros=True)
    message = (
        f"the slimmed model's outputs differ from the masked model's by up to {worst:.3g}: a removed channel "
        "still carried a bias or a norm's shift, which went with it; prune those with the weights for an exact match"
    )
    notes.append(message)
    warnings.warn(message, UserWarning, stacklevel=5)
    return None


def _difference(expected: list[Tensor], got: list[Tensor]) -> float | None:
    """The largest difference between two lists of outputs, or ``None`` within float noise.

    Float noise is relative to each output's largest magnitude (a randomly
    initialised deep network's outputs reach 1e9, where summing in another
    order moves them by hundreds).
    """
    worst = None
    for a, b in zip(expected, got, strict=True):
        if not a.is_floating_point() or not a.numel():
            continue
        difference = float((a.double() - b.double()).abs().max())
        if difference > 1e-5 + 1e-4 * float(a.double().abs().max()):
            worst = max(worst or 0.0, difference)
    return worst


def _zeroed_outputs(
    model: nn.Module, keep: dict[TensorDim, Tensor], inputs: tuple[tuple[Any, ...], dict[str, Any]]
) -> list[Tensor]:
    """The outputs of ``model`` with every parameter entry of the removed positions set to zero (nothing cut)."""
    parameters = dict(model.named_parameters(remove_duplicate=False))
    zeroed: dict[str, Tensor] = {}
    for (name, dim), positions in keep.items():
        if name not in parameters:
            continue
        tensor = zeroed.get(name, parameters[name].detach())
        stays = torch.zeros(tensor.shape[dim], dtype=torch.bool, device=tensor.device)
        stays[positions.to(tensor.device)] = True
        shape = [1] * tensor.dim()
        shape[dim] = -1
        zeroed[name] = tensor * stays.reshape(shape).to(tensor.dtype)
    args, kwargs = inputs
    with torch.no_grad(), leaves_no_state(model):
        return tensors(torch.func.functional_call(model, zeroed, args, kwargs))


def _changed_widths(changes: list[TensorChange], groups: list[Group], removed: dict[int, set[int]]) -> set[int]:
    """Each size slimming changed: a dimension's old length, a group's old unit count (its heads)."""
    widths = {groups[g].size for g, units in removed.items() if units}
    for change in changes:
        widths.update(old for old, new in zip(change.before, change.after, strict=True) if old != new)
    return widths


def parameter_values(model: nn.Module, graph: DependencyGraph) -> dict[str, Tensor]:
    """Each parameter the graph knows, as the model computes with it (``orig * mask`` for a pruned one)."""
    parameters = dict(model.named_parameters(remove_duplicate=False))
    masks = pruning_masks(model)
    values: dict[str, Tensor] = {}
    for name in graph.tensors:
        if name not in parameters:
            continue
        value = parameters[name].detach()
        mask = masks.get(name)
        values[name] = value * mask.to(value.dtype) if mask is not None else value
    return values


def pruning_masks(model: nn.Module) -> dict[str, Tensor]:
    """Each pruned parameter (``<name>_orig``) to its ``<name>_mask``."""
    buffers = dict(model.named_buffers(remove_duplicate=False))
    masks: dict[str, Tensor] = {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        mask = buffers.get(name[: -len("_orig")] + "_mask") if name.endswith("_orig") else None
        if mask is not None:
            masks[name] = mask
    return masks


def forward(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The model's outputs, its modules left as they were (:func:`~prunereg._slim.graph.leaves_no_state`)."""
    with torch.no_grad(), leaves_no_state(model, tensors=False):
        return model(*args, **kwargs)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def exported_outputs(exported: Captured) -> list[Tensor]:
    """The model's output tensors as torch.export saw them, as meta tensors (no forward needed)."""
    specs = exported.graph_signature.output_specs
    user = [getattr(spec.arg, "name", None) for spec in specs if spec.kind.name == "USER_OUTPUT"]
    values = {node.name: node.meta.get("val") for node in exported.graph.nodes}
    found = [values.get(name) for name in user]
    return [torch.empty(value.shape, dtype=value.dtype, device="meta") for value in found if isinstance(value, Tensor)]


def _shapes(outputs: list[Tensor]) -> list[tuple[int, ...]]:
    return [tuple(tensor.shape) for tensor in outputs]


def tensors(output: Any) -> list[Tensor]:
    """The tensors in ``output``, in the order torch.export flattens them."""
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves(output) if isinstance(leaf, Tensor)]
