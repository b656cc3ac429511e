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
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._core.reparam import PruningHook, set_pruned_tensor
from prunereg._models import slimmed as shapes
from prunereg._slim.graph import DependencyGraph, SlimError, build_graph, export_model
from prunereg._slim.groups import Group, TensorDim, find_groups, kept_positions
from prunereg._slim.importance import Importance, resolve_importance
from prunereg._slim.report import SlimReport, TensorChange
from prunereg._slim.surgery import keep_indices, sync_shape_attributes
from prunereg._slim.widths import rewrite_config, sync_attention


def slim(
    model: nn.Module,
    example_inputs: Any,
    *,
    ratio: float | None = None,
    importance: str | Importance = "magnitude",
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
    (``"magnitude"``, ``"random"``, ``"taylor"``, a registered name, or an
    :class:`~prunereg.Importance`), keeping a multiple of ``round_to`` of
    them (units, as the ratio counts: channels, or heads where heads go whole).
    ``ignore``: modules (or their names) that keep every tensor whole. The
    model's inputs and outputs always keep their shapes, so the output head
    keeps its outputs.

    Raises :class:`~prunereg.SlimError` naming the layer and the operation
    when the model cannot be slimmed as asked; the model is then unchanged.
    """
    args, kwargs = _inputs(model, example_inputs)
    _check_arguments(ratio, round_to)
    scorer = resolve_importance(importance) if ratio is not None else None
    pinned = _module_names(model, ignore)
    with _eval_mode(model), _restored_on_error(model):  # any failure, from planning to the config: as it was
        exported = export_model(model, args, kwargs)
        graph = build_graph(model, exported, pinned)
        groups = find_groups(graph, every=ratio is None)
        values = _values(model, graph)
        notes: list[str] = []
        if ratio is None:
            removed = _masked_units(groups, graph, values, notes)
        else:
            assert scorer is not None
            scorer.prepare(model, args, kwargs)
            removed = _lowest_units(groups, scorer, values, ratio, round_to)
        keep = kept_positions(groups, removed)
        gone = {groups[g].units[k] for g, units in removed.items() for k in units}
        macs_before, macs_after = graph.count_macs(), graph.count_macs(gone)
        params_before, outputs_before = _parameter_count(model), _exported_output_shapes(exported)
        masked = _tensors(_forward(model, args, kwargs)) if ratio is None and keep else None
        before = shapes.snapshot(model)
        # nothing is cut before this line
        changes = _cut(model, graph, keep)
        params_after, slimmed = _parameter_count(model), _run_after(model, args, kwargs)
        outputs_after = [tuple(t.shape) for t in slimmed]
        if outputs_after != outputs_before:
            raise SlimError(f"slimming would change the model's output shapes {outputs_before} to {outputs_after}")
        if masked is not None:
            _compare_with_masked(masked, slimmed, notes)
        shapes.record(model, before)
        rewritten = rewrite_config(model, before, lambda m: _tensors(_forward(m, args, kwargs)), slimmed)
    return SlimReport(
        ratio=ratio,
        importance=None if ratio is None else _importance_name(importance),
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


def _check_arguments(ratio: float | None, round_to: int) -> None:
    if ratio is not None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
            raise TypeError(f"ratio must be a float in [0, 1) or None, not {type(ratio).__name__}")
        if not 0.0 <= float(ratio) < 1.0:
            raise ValueError(f"ratio must lie in [0, 1), got {ratio}")
    if isinstance(round_to, bool) or not isinstance(round_to, int):
        raise TypeError(f"round_to must be an int, not {type(round_to).__name__}")
    if round_to < 1:
        raise ValueError(f"round_to must be at least 1, got {round_to}")


def _module_names(model: nn.Module, ignore: Sequence[str | nn.Module]) -> list[str]:
    if isinstance(ignore, (str, nn.Module)):
        ignore = [ignore]
    by_object = {id(module): name for name, module in model.named_modules(remove_duplicate=False)}
    names: list[str] = []
    for item in ignore:
        if isinstance(item, nn.Module):
            if id(item) not in by_object:
                raise ValueError(f"ignore names a {type(item).__name__} that is not part of the model")
            names.append(by_object[id(item)])
        elif isinstance(item, str):
            try:
                model.get_submodule(item)
            except AttributeError as error:
                raise ValueError(f"ignore names {item!r}, which is no module of the model") from error
            names.append(item)
        else:
            raise TypeError(f"ignore holds modules or module names, not {type(item).__name__}")
    return names


def _importance_name(importance: str | Importance) -> str:
    return importance if isinstance(importance, str) else type(importance).__name__


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode while slimming (dropout off, norms on their running statistics); the modes restored after."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


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


def _lowest_units(
    groups: list[Group], scorer: Importance, values: Mapping[str, Tensor], ratio: float, round_to: int
) -> dict[int, set[int]]:
    removed: dict[int, set[int]] = {}
    for g, group in enumerate(groups):
        keep = group.size - math.floor(group.size * ratio + 1e-9)
        keep = min(group.size, max(1, math.ceil(keep / round_to) * round_to))
        count = min(group.size - keep, len(group.removable))
        if count <= 0:
            continue
        scores = scorer(group, values)
        if not isinstance(scores, Tensor) or scores.shape != (group.size,):
            raise ValueError(
                f"importance {type(scorer).__name__} gave {scores!r}, not one score per unit ({group.size})"
            )
        candidates = torch.tensor(group.removable, dtype=torch.long)
        order = torch.argsort(scores[candidates].to(torch.float64), stable=True)
        gone = set(candidates[order[:count]].tolist())
        for unit_index in group.members.values():  # every tensor dimension keeps a position
            units = set(unit_index.unique().tolist())
            if units <= gone:
                gone.discard(max(units, key=lambda k: float(scores[k])))
        removed[g] = gone
    return removed


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


def _run_after(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    """The slimmed model's output tensors on the example inputs; a failure becomes a :class:`SlimError`."""
    try:
        return _tensors(_forward(model, args, kwargs))
    except Exception as error:  # any failure of the slimmed model is reported, the model restored
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise SlimError(
            f"the slimmed model fails on the example inputs ({type(error).__name__}: {first_line}); a module reads "
            "a width from somewhere slimming does not know: pass it (or its parent) in ignore="
        ) from error


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


def _exported_output_shapes(exported: torch.export.ExportedProgram) -> list[tuple[int, ...]]:
    """The shapes of the model's outputs as torch.export saw them (no forward needed)."""
    specs = exported.graph_signature.output_specs
    user = [getattr(spec.arg, "name", None) for spec in specs if spec.kind.name == "USER_OUTPUT"]
    values = {node.name: node.meta.get("val") for node in exported.graph.nodes}
    return [tuple(values[name].shape) for name in user if isinstance(values.get(name), Tensor)]


def _tensors(output: Any) -> list[Tensor]:
    """The tensors in ``output``, in the order torch.export flattens them."""
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves(output) if isinstance(leaf, Tensor)]
