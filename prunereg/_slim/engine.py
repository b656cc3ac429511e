"""``prunereg.slim``: remove channels, heads and groups so that a model is physically smaller.

Everything is planned before anything is cut: the graph (:mod:`.graph`), the
groups (:mod:`.groups`), the scores (:mod:`.importance`) and every tensor's
kept positions. Then :mod:`.surgery` cuts, the modules' size attributes are
set, and the model runs once on the example inputs; if that fails or an
output changes shape, every module is put back exactly as it was (the cut
tensors are new ones, the old ones are kept until then) and
:class:`~prunereg._slim.graph.SlimError` names what failed.
"""

from __future__ import annotations

import contextlib
import copy
import math
import shlex
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._core.reparam import PruningHook, set_pruned_tensor
from prunereg._models import slimmed as shapes
from prunereg._runtime.mode import eval_mode
from prunereg._slim.graph import DependencyGraph, SlimError, build_graph, export_model, export_quietly
from prunereg._slim.groups import Group, TensorDim, find_groups, kept_positions
from prunereg._slim.importance import Importance, resolve_importance
from prunereg._slim.report import SlimReport, TensorChange
from prunereg._slim.surgery import keep_indices, sync_shape_attributes
from prunereg._slim.widths import rewrite_config, sync_attention, width_readers


def slim(
    model: nn.Module,
    example_inputs: Any,
    *,
    ratio: float | None = None,
    importance: str | Importance | None = None,
    ignore: Sequence[str | nn.Module] = (),
    round_to: int = 1,
) -> SlimReport:
    """Remove channels from ``model`` in place, so that it is physically smaller and faster.

    ``example_inputs``: a tensor, a tuple of positional inputs or a dict of
    keyword inputs; the model is exported (``torch.export``) on them to find
    which tensor dimensions must lose the same positions together.

    ``ratio=None`` removes exactly the channels already pruned structurally
    (whole rows or filters zero in a ``<name>_mask``, e.g. by ``ln_structured``),
    after checking that every layer coupled to them has them pruned too.
    ``ratio=r`` removes ``r`` of every dependency group's channels (heads and
    convolution groups count as one each), the lowest by ``importance``
    (``"magnitude"``, the default, ``"random"``, ``"taylor"``, a registered
    name, or an :class:`~prunereg.Importance`), keeping a multiple of
    ``round_to`` of them (units, as the ratio counts: channels, or heads where
    heads go whole); both need a ratio. ``ignore``: a list of modules (or their
    names) that keep every tensor whole. The model's inputs and outputs always
    keep their shapes, so the output head keeps its outputs. A model on the
    meta device slims too, by an importance that needs no values (``"random"``).

    Raises :class:`~prunereg.SlimError` naming the layer and the operation
    when the model cannot be slimmed as asked; the model is then unchanged.
    A slim that removes nothing warns (and notes in the report) why.
    """
    args, kwargs = _inputs(model, example_inputs)
    scorer, ignored = check_arguments(ratio, importance, ignore, round_to)
    pinned = _module_names(model, ignored)
    on_meta = _refuse_meta(model, args, kwargs, masked=ratio is None)
    with eval_mode(model), _restored_on_error(model):  # any failure, from planning to the config: as it was
        exported = export_model(model, args, kwargs)
        graph = build_graph(model, exported, pinned)
        groups = find_groups(graph, every=ratio is None)
        values = _values(model, graph)
        notes: list[str] = []
        if ratio is None:
            removed = _masked_units(groups, graph, values, notes)
        else:
            assert scorer is not None
            name = _importance_name(importance or "magnitude")
            with _values_needed(name, on_meta):
                scorer.prepare(model, args, kwargs)
            removed = _lowest_units(groups, _scorer(scorer, name, values, on_meta), ratio, round_to)
        if not any(removed.values()) and ratio != 0:
            _nothing_removed(groups, ratio, round_to, notes)
        keep = kept_positions(groups, removed)
        gone = {groups[g].units[k] for g, units in removed.items() for k in units}
        macs_before, macs_after = graph.count_macs(), graph.count_macs(gone)
        params_before, outputs_before = _parameter_count(model), _shapes(_exported_outputs(exported))
        masked = _tensors(_forward(model, args, kwargs)) if ratio is None and keep else None
        before = shapes.snapshot(model)
        # nothing is cut before this line
        changes = _cut(model, graph, keep)
        widths = _changed_widths(changes, groups, removed)
        params_after, slimmed = _parameter_count(model), _run_after(model, args, kwargs, widths, on_meta)
        outputs_after = _shapes(slimmed)
        if outputs_after != outputs_before:
            raise SlimError(f"slimming would change the model's output shapes {outputs_before} to {outputs_after}")
        if masked is not None:
            _compare_with_masked(masked, slimmed, notes)
        shapes.record(model, before)
        rewritten = rewrite_config(model, before, lambda m: _tensors(_forward(m, args, kwargs)), slimmed)
    return SlimReport(
        ratio=ratio,
        importance=None if ratio is None else _importance_name(importance or "magnitude"),
        params_before=params_before,
        params_after=params_after,
        macs_before=macs_before,
        macs_after=macs_after,
        groups=sum(1 for group in groups if group.size > 1 and group.removable),
        removed=sum(len(units) for units in removed.values()),
        changes=changes,
        notes=notes,
        config_rewritten=rewritten,
    )


# -- arguments --------------------------------------------------------------------------------------------------
class ArgumentError(ValueError):
    """A bad argument of :func:`prunereg.slim`, said with its keywords, and with ``prunereg slim``'s flags."""

    def __init__(self, say: Callable[[Callable[..., str]], str]) -> None:
        super().__init__(say(_keyword))
        self.command_line_message = say(_flag)


def _keyword(name: str, *value: Any) -> str:
    return f"{name}={value[0]!r}" if value else name


def _flag(name: str, *value: Any) -> str:
    flag = "--" + name.replace("_", "-")
    return f"{flag} {shlex.quote(str(value[0]))}" if value else flag


def _inputs(model: nn.Module, example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"slim needs an nn.Module, not {type(model).__name__}")
    if isinstance(example_inputs, Tensor):
        args: tuple[Any, ...] = (example_inputs,)
        kwargs: dict[str, Any] = {}
    elif isinstance(example_inputs, Mapping):
        args, kwargs = (), dict(example_inputs)
    elif isinstance(example_inputs, (tuple, list)):
        args, kwargs = tuple(example_inputs), {}
    else:
        kind = type(example_inputs).__name__
        raise TypeError(f"example_inputs must be a tensor, a tuple of inputs or a dict of keyword inputs, not {kind}")
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "use_cache") and "use_cache" not in kwargs:
        kwargs["use_cache"] = False  # a cache object is no tensor output; slimming needs none
    return args, kwargs


def check_arguments(
    ratio: float | None, importance: str | Importance | None, ignore: Sequence[str | nn.Module], round_to: int
) -> tuple[Importance | None, list[str | nn.Module]]:
    """Refuse arguments of :func:`slim` that are wrong whatever the model; the importance to rank by, and ``ignore``.

    ``prunereg slim`` calls it before it loads the model. A setting that would
    change nothing (``round_to`` or ``importance`` without a ratio, the root
    module in ``ignore``) is refused, not ignored.
    """
    if ratio is not None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
            raise TypeError(f"ratio must be a float in [0, 1) or None, not {type(ratio).__name__}")
        if not 0.0 <= float(ratio) < 1.0:
            raise ValueError(f"ratio must lie in [0, 1), got {ratio}")
    if isinstance(round_to, bool) or not isinstance(round_to, int):
        raise TypeError(f"round_to must be an int, not {type(round_to).__name__}")
    if round_to < 1:
        raise ValueError(f"round_to must be at least 1, got {round_to}")
    if ratio is None and importance is not None:
        raise _needs_a_ratio("importance", _importance_name(importance))
    if ratio is None and round_to != 1:
        raise _needs_a_ratio("round_to", round_to)
    ignored = _ignore_list(ignore)
    return resolve_importance(importance or "magnitude") if ratio is not None else None, ignored


def _needs_a_ratio(name: str, value: object) -> ArgumentError:
    return ArgumentError(
        lambda say: (
            f"{say(name, value)} applies to a ratio; without {say('ratio')} the masks choose the channels: "
            f"give {say('ratio')}, or leave {say(name)} out"
        )
    )


_ROOT = "ignoring the root ignores everything: name the modules to keep whole"


def _ignore_list(ignore: Sequence[str | nn.Module]) -> list[str | nn.Module]:
    if isinstance(ignore, (str, nn.Module)) or not isinstance(ignore, Iterable):
        shown = repr(ignore) if isinstance(ignore, str) else "module"
        raise TypeError(
            f"ignore must be a list of modules or module names, not a {type(ignore).__name__}: pass ignore=[{shown}]"
        )
    ignored = list(ignore)
    for item in ignored:
        if not isinstance(item, (str, nn.Module)):
            raise TypeError(f"ignore holds modules or module names, not {type(item).__name__}")
        if isinstance(item, str) and not item:
            raise ArgumentError(lambda say: f"{say('ignore', '')} names the root module, and {_ROOT}")
    return ignored


def _module_names(model: nn.Module, ignore: list[str | nn.Module]) -> list[str]:
    by_object = {id(module): name for name, module in model.named_modules(remove_duplicate=False)}
    names: list[str] = []
    for item in ignore:
        if isinstance(item, nn.Module):
            if item is model:
                raise ValueError(f"ignore holds the model itself, the root module, and {_ROOT}")
            if id(item) not in by_object:
                raise ValueError(f"ignore names a {type(item).__name__} that is not part of the model")
            names.append(by_object[id(item)])
        else:
            try:
                model.get_submodule(item)
            except AttributeError as error:
                raise ValueError(f"ignore names {item!r}, which is no module of the model") from error
            names.append(item)
    return names


def _refuse_meta(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, masked: bool) -> bool:
    """Whether the model is on the meta device, where it holds shapes but no values.

    The graph, the cut and the report need shapes only, so a meta model slims
    by a ratio (the importance must need no values either: see :func:`_scorer`).
    Slimming by the masks reads their zeros, and a model partly on the meta
    device cannot run: both are refused before anything else happens.
    """
    from torch.utils._pytree import tree_leaves

    tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    meta = [name for name, tensor in tensors if tensor.is_meta]
    if not meta:
        return False
    where = f"'{meta[0].removesuffix('_orig')}' is on the meta device, which holds shapes but no values"
    if masked:
        raise SlimError(f"{where}: slimming without a ratio reads which channels the masks pruned; load the weights")
    elsewhere = [f"'{name}'" for name, tensor in tensors if not tensor.is_meta]
    inputs = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, Tensor)]
    elsewhere += ["an example input" for leaf in inputs if not leaf.is_meta]
    if elsewhere:
        raise SlimError(f"{where}, and {elsewhere[0]} is not: put the model and the example inputs on one device")
    return True


def _importance_name(importance: str | Importance) -> str:
    return importance if isinstance(importance, str) else type(importance).__name__


# -- choosing ---------------------------------------------------------------------------------------------------
def _values(model: nn.Module, graph: DependencyGraph) -> dict[str, Tensor]:
    """Each parameter the graph knows, as the model computes with it (``orig * mask`` for a pruned one)."""
    parameters = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers(remove_duplicate=False))
    values: dict[str, Tensor] = {}
    for name in graph.tensors:
        if name not in parameters:
            continue
        value = parameters[name].detach()
        if name.endswith("_orig"):
            mask = buffers.get(name[: -len("_orig")] + "_mask")
            if mask is not None:
                value = value * mask.to(value.dtype)
        values[name] = value
    return values


def _scorer(
    importance: Importance, name: str, values: Mapping[str, Tensor], on_meta: bool
) -> Callable[[Group], Tensor]:
    """``importance``'s scores of a group, checked: one per unit, computed from values a meta model has."""

    def score(group: Group) -> Tensor:
        with _values_needed(name, on_meta):
            scores = importance(group, values)
        if not isinstance(scores, Tensor) or scores.shape != (group.size,):
            raise ValueError(f"importance {name} gave {scores!r}, not one score per unit ({group.size})")
        if scores.is_meta:
            raise _no_values(name)
        return scores

    return score


@contextlib.contextmanager
def _values_needed(name: str, on_meta: bool) -> Iterator[None]:
    """On a meta model, any failure of the importance ``name`` is that it needs values the model does not have."""
    try:
        yield
    except Exception as error:
        if not on_meta:
            raise
        raise _no_values(name) from error


def _no_values(name: str) -> SlimError:
    return SlimError(
        f"importance {name} ranks channels by values, which a model on the meta device does not have: load the "
        "weights, or use importance='random' to plan the slimmed shapes"
    )


def _lowest_units(
    groups: list[Group], score: Callable[[Group], Tensor], ratio: float, round_to: int
) -> dict[int, set[int]]:
    removed: dict[int, set[int]] = {}
    for g, group in enumerate(groups):
        count = min(group.size - _units_kept(group.size, ratio, round_to), len(group.removable))
        if count <= 0:
            continue
        scores = score(group)
        candidates = torch.tensor(group.removable, dtype=torch.long)
        order = torch.argsort(scores[candidates].to(torch.float64), stable=True)
        gone = set(candidates[order[:count]].tolist())
        for unit_index in group.members.values():  # every tensor dimension keeps a position
            units = set(unit_index.unique().tolist())
            if units <= gone:
                gone.discard(max(units, key=lambda k: float(scores[k])))
        removed[g] = gone
    return removed


def _units_kept(size: int, ratio: float, round_to: int) -> int:
    keep = size - math.floor(size * ratio + 1e-9)
    return min(size, max(1, math.ceil(keep / round_to) * round_to))


def _largest(groups: list[Group]) -> int:
    return max(group.size for group in groups)


def _nothing_removed(groups: list[Group], ratio: float | None, round_to: int, notes: list[str]) -> None:
    """Warn (and note) that slimming removed nothing, and why, rather than write an unchanged model in silence."""
    if ratio is None:
        why = "no channel is pruned whole (its rows or filters at zero in every layer that makes it)"
    elif not groups:
        why = "every channel is kept whole (an ignored module, a model input or output, an operation not followed)"
    elif all(_units_kept(group.size, ratio, 1) == group.size for group in groups):
        why = f"ratio {ratio:g} of a group is less than one unit (the largest group has {_largest(groups)})"
    else:
        why = f"round_to={round_to} keeps every group whole: the largest has {_largest(groups)} units"
    message = f"slimming removed nothing: {why}"
    notes.append(message)
    warnings.warn(message, UserWarning, stacklevel=3)


def _masked_units(
    groups: list[Group], graph: DependencyGraph, values: Mapping[str, Tensor], notes: list[str]
) -> dict[int, set[int]]:
    """The units whose channels are pruned already, and can go without changing what the model computes.

    A unit is pruned when a layer makes it at zero (its rows, its filters): it
    can go when every layer making it makes zeros, or every layer reading it
    reads zeros; a unit every layer reads with zeros (input columns pruned)
    goes too.
    """
    removed: dict[int, set[int]] = {}
    for g, group in enumerate(groups):
        made, read = _zero_units(group, graph.producers, values), _zero_units(group, graph.consumers, values)
        if not made and not read:
            continue
        # rows or filters at zero choose a unit; input columns only when every layer reading it has them at zero
        # (a column can be all zero by chance under unstructured pruning)
        unread = torch.stack(list(read.values())).all(dim=0) if read else torch.zeros(group.size, dtype=torch.bool)
        chosen = unread | (torch.stack(list(made.values())).any(dim=0) if made else unread)
        for k in chosen.nonzero().flatten().tolist():
            if group.pinned[k] is not None:
                raise SlimError(f"{_unit_text(group, k)} is pruned, but cannot be removed: {group.pinned[k]}")
            if not (bool(unread[k]) or all(bool(zero[k]) for zero in made.values())):
                keeping = next(name for (name, _), zero in made.items() if not bool(zero[k]))
                raise SlimError(
                    f"{_unit_text(group, k)} is pruned, but {_tensor_text(keeping)} is coupled to it "
                    "(a residual add, concatenation or shared input) and keeps it: prune it there too, or not at all"
                )
        for key, unit_index in group.members.items():
            if bool(chosen[unit_index].all()):
                raise SlimError(
                    f"every channel of {_tensor_text(key[0])} (dim {key[1]}) is pruned: slimming would leave none"
                )
        if chosen.any():
            removed[g] = set(chosen.nonzero().flatten().tolist())
        partial = _partially_zero(group, made, graph, values)
        if partial:
            notes.append(partial)
    return removed


def _zero_units(group: Group, dims: set[TensorDim], values: Mapping[str, Tensor]) -> dict[TensorDim, Tensor]:
    """Per tensor dimension of ``dims`` in ``group``: which units it holds only zeros of."""
    return {
        key: _units_all_zero(values[key[0]], key[1], unit_index, group.size)
        for key, unit_index in group.members.items()
        if key in dims and key[0] in values
    }


def _units_all_zero(value: Tensor, dim: int, unit_index: Tensor, units: int) -> Tensor:
    nonzero = value.ne(0)
    if nonzero.dim() > 1:
        nonzero = nonzero.any(dim=[d for d in range(nonzero.dim()) if d != dim])
    count = torch.zeros(units, dtype=torch.long).index_add_(0, unit_index, nonzero.long().cpu())
    return count == 0


def _partially_zero(
    group: Group, zero_in: Mapping[TensorDim, Tensor], graph: DependencyGraph, values: Mapping[str, Tensor]
) -> str | None:
    for key in zero_in:
        value = values[key[0]]
        rows = value.ne(0)
        if rows.dim() > 1:
            rows = rows.any(dim=[d for d in range(rows.dim()) if d != key[1]])
        zero_positions = int((~rows).sum())
        removed_positions = int(torch.isin(group.members[key], zero_in[key].nonzero().flatten()).sum())
        if zero_positions > removed_positions:
            return (
                f"{zero_positions - removed_positions} pruned channels of {_tensor_text(key[0])} stay: "
                "each belongs to a unit (a head, a convolution group) that is not entirely pruned"
            )
    return None


def _tensor_text(name: str) -> str:
    return f"'{name.removesuffix('_orig')}'"


def _unit_text(group: Group, k: int, whole: bool = False) -> str:
    key = next(iter(sorted(group.members, key=lambda key: (key[1], key[0]))))
    if whole:
        return f"the channels of {_tensor_text(key[0])} (dim {key[1]})"
    positions = (group.members[key] == k).nonzero().flatten().tolist()
    where = f"position {positions[0]}" if len(positions) == 1 else f"positions {positions[0]}..{positions[-1]}"
    return f"{where} of {_tensor_text(key[0])} (dim {key[1]})"


# -- cutting ----------------------------------------------------------------------------------------------------
def _cut(model: nn.Module, graph: DependencyGraph, keep: dict[TensorDim, Tensor]) -> list[TensorChange]:
    by_tensor: dict[str, list[tuple[int, Tensor]]] = {}
    for (name, dim), positions in keep.items():
        by_tensor.setdefault(name, []).append((dim, positions))
    aliases = _aliases(model)
    names = {id(module): name for name, module in model.named_modules(remove_duplicate=False)}
    touched: dict[str, nn.Module] = {}
    changes: list[TensorChange] = []
    order = {name: k for k, name in enumerate(graph.tensors)}
    for name in sorted(by_tensor, key=order.__getitem__):
        owner, _, attribute = name.rpartition(".")
        module = model.get_submodule(owner)
        old = getattr(module, attribute)
        before = tuple(old.shape)
        for dim, positions in sorted(by_tensor[name], key=lambda item: item[0]):
            keep_indices(module, attribute, dim, positions)
        new = getattr(module, attribute)
        for other_module, other_attribute in aliases.get(id(old), []):
            holder = other_module._parameters if other_attribute in other_module._parameters else other_module._buffers
            holder[other_attribute] = new
            touched[names[id(other_module)]] = other_module
        touched[owner] = module
        if not name.endswith("_mask"):
            changes.append(TensorChange(name.removesuffix("_orig"), before, tuple(new.shape)))
    for owner, module in touched.items():
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, PruningHook):
                set_pruned_tensor(hook, module)
        if owner in graph.conv_groups and isinstance(module, nn.modules.conv._ConvNd):
            module.groups = module.weight.shape[0] // graph.conv_groups[owner]
        sync_shape_attributes(module)
        if owner in graph.norm_groups and isinstance(module, nn.GroupNorm):
            module.num_groups = module.num_channels // graph.norm_groups[owner]
    for owner in {name.rpartition(".")[0] for name in touched}:
        parent = model.get_submodule(owner) if owner else model
        sync_attention(parent)
    for name, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention) and any(t.startswith(name + ".") or t == name for t in touched):
            sync_attention(module)
    return changes


def _aliases(model: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    """Every (module, name) holding each parameter or buffer, so that a tied tensor is cut once for all holders."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, tensor in [*module._parameters.items(), *module._buffers.items()]:
            if tensor is not None:
                holders.setdefault(id(tensor), []).append((module, name))
    return holders


@contextlib.contextmanager
def _restored_on_error(model: nn.Module) -> Iterator[None]:
    """Put every module (and a Hugging Face config) back exactly as it was if the block raises."""
    saved = []
    for module in model.modules():
        state = dict(module.__dict__)
        state["_parameters"] = dict(module._parameters)
        state["_buffers"] = dict(module._buffers)
        saved.append((module, state))
    config = getattr(model, "config", None)
    config_state = copy.copy(config.__dict__) if config is not None and hasattr(config, "__dict__") else None
    try:
        yield
    except BaseException:
        for module, state in saved:
            module.__dict__.clear()
            module.__dict__.update(state)
        if config_state is not None:
            config.__dict__.clear()
            config.__dict__.update(config_state)
        raise


# -- measuring --------------------------------------------------------------------------------------------------
def _forward(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with torch.no_grad():
        return model(*args, **kwargs)


def _parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _run_after(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], widths: set[int], on_meta: bool
) -> list[Tensor]:
    """The slimmed model's output tensors on the example inputs; a failure becomes a :class:`SlimError`.

    ``widths``: the sizes slimming changed; a module that failed reading an
    attribute holding one of them is named, with the attribute. A model on the
    meta device is exported instead of run (its outputs: meta tensors of their
    shapes), as its code may ask for values (transformers' masks call ``.all()``).
    """
    try:
        if on_meta:
            return _exported_outputs(export_quietly(model, args, kwargs))
        return _tensors(_forward(model, args, kwargs))
    except Exception as error:  # any failure of the slimmed model is reported, the model restored
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        failed = f"the slimmed model fails on the example inputs ({type(error).__name__}: {first_line})"
        module, read = width_readers(error, model, widths)
        if read:
            said = " and ".join(f"self.{name} ({value})" for name, value in read.items())
            raise SlimError(
                f"{failed}: '{module}' reads {said}, {'a width' if len(read) == 1 else 'widths'} slimming changed "
                f"but cannot set there: pass ignore=['{module}'] to keep that module whole"
            ) from error
        raise SlimError(
            f"{failed}; a module reads a width from somewhere slimming does not know: pass it (or its parent) in "
            "ignore="
        ) from error


def _changed_widths(changes: list[TensorChange], groups: list[Group], removed: dict[int, set[int]]) -> set[int]:
    """Each size slimming changed: a dimension's old length, a group's old unit count (its heads)."""
    widths = {groups[g].size for g, units in removed.items() if units}
    for change in changes:
        widths.update(old for old, new in zip(change.before, change.after, strict=True) if old != new)
    return widths


def _compare_with_masked(masked: list[Tensor], slimmed: list[Tensor], notes: list[str]) -> None:
    """Warn (and note) when the slimmed outputs are not the masked model's: a removed channel carried a constant."""
    worst = max(
        (float((a.double() - b.double()).abs().max()) for a, b in zip(masked, slimmed, strict=True)
         if a.is_floating_point() and a.numel() and not torch.allclose(a, b, rtol=1e-4, atol=1e-5)),
        default=None,
    )  # fmt: skip
    if worst is None:
        return
    message = (
        f"the slimmed model's outputs differ from the masked model's by up to {worst:.3g}: a removed channel "
        "still carried a bias or a norm's shift, which went with it; prune those with the weights for an exact match"
    )
    notes.append(message)
    warnings.warn(message, UserWarning, stacklevel=3)


def _exported_outputs(exported: torch.export.ExportedProgram) -> list[Tensor]:
    """The model's output tensors as torch.export saw them, as meta tensors (no forward needed)."""
    specs = exported.graph_signature.output_specs
    user = [getattr(spec.arg, "name", None) for spec in specs if spec.kind.name == "USER_OUTPUT"]
    values = {node.name: node.meta.get("val") for node in exported.graph.nodes}
    found = [values.get(name) for name in user]
    return [torch.empty(value.shape, dtype=value.dtype, device="meta") for value in found if isinstance(value, Tensor)]


def _shapes(tensors: list[Tensor]) -> list[tuple[int, ...]]:
    return [tuple(tensor.shape) for tensor in tensors]


def _tensors(output: Any) -> list[Tensor]:
    """The tensors in ``output``, in the order torch.export flattens them."""
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves(output) if isinstance(leaf, Tensor)]
