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
import math
import shlex
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._models import slimmed as shapes
from prunereg._runtime.mode import eval_mode
from prunereg._selection.amount import count_for
from prunereg._selection.select import removal_order
from prunereg._slim.attempt import Chooser, Fallback, Slimmed, attempt, forward, pruning_masks, tensors
from prunereg._slim.cut import Snapshot
from prunereg._slim.graph import GROUPED, DependencyGraph, SlimError, capture_model
from prunereg._slim.groups import Chosen, Group
from prunereg._slim.importance import Importance, resolve_importance
from prunereg._slim.masked import choose_pruned
from prunereg._slim.report import SlimReport
from prunereg._slim.units import TensorDim
from prunereg._slim.widths import rewrite_config


def slim(
    model: nn.Module,
    example_inputs: Any,
    *,
    ratio: float | None = None,
    importance: str | Importance | None = None,
    ignore: Sequence[str | nn.Module] = (),
    round_to: int = 1,
    grouped: str = "whole",
) -> SlimReport:
    """Remove channels from ``model`` in place, so that it is physically smaller and faster.

    ``example_inputs``: a tensor, a tuple of positional inputs or a dict of
    keyword inputs; one forward on them, recorded (or ``torch.export`` where
    that could mislead: see docs/slimming.md), shows which tensor dimensions
    must lose the same positions together.

    ``ratio=None`` removes exactly the channels already pruned structurally
    (whole rows or filters zero in a ``<name>_mask``, e.g. by ``ln_structured``),
    after checking that every layer coupled to them has them pruned too, and
    channels that are exact zeros without a mask where removing them changes
    no output (others stay, noted in the report; on a model without masks or
    zeros it changes nothing).
    ``ratio=r`` removes ``r`` of every dependency group's channels (heads and
    convolution groups count as one each), the lowest by ``importance``
    (``"magnitude"``, the default, ``"random"``, ``"taylor"``, a registered
    name, or an :class:`~prunereg.Importance`), keeping a multiple of
    ``round_to`` of them (units, as the ratio counts: channels, or heads where
    heads go whole); both need a ratio. ``ignore``: a list of modules (or their
    names) that keep every tensor whole. ``grouped``: how a grouped (not
    depthwise) convolution loses channels, ``"whole"`` groups or the same
    channels ``"inside"`` each group. The model's inputs and outputs always
    keep their shapes, so the output head keeps its outputs. A model on the
    meta device slims too, by an importance that needs no values (``"random"``).

    After the cut every operation must make the shape the plan says: with a
    ratio, a module that does not (it computes a width slimming cannot set) is
    kept whole, with a warning (see :func:`~prunereg.register_width_rule`).

    Raises :class:`~prunereg.SlimError` naming the layer and the operation
    when the model cannot be slimmed as asked; the model is then unchanged.
    A slim that removes nothing warns (and notes in the report) why.
    """
    return slim_keeping(model, example_inputs, SlimArguments(ratio, importance, ignore, round_to, grouped))[0]


@dataclass(frozen=True)
class SlimArguments:
    """:func:`slim`'s keyword arguments, as :func:`slim_keeping` takes them."""

    ratio: float | None = None
    importance: str | Importance | None = None
    ignore: Sequence[str | nn.Module] = ()
    round_to: int = 1
    grouped: str = "whole"


def slim_keeping(
    model: nn.Module, example_inputs: Any, arguments: SlimArguments, *, config_by_shapes: bool = False
) -> tuple[SlimReport, dict[TensorDim, Tensor]]:
    """:func:`slim`, and per tensor dimension that lost positions, the sorted positions it kept.

    ``config_by_shapes``: a Hugging Face config is rewritten when a model built
    from it has the slimmed shapes, without running it (a model on the meta
    device, whose weights stay in a folder, has no outputs to compare).
    """
    ratio, importance, round_to, grouped = arguments.ratio, arguments.importance, arguments.round_to, arguments.grouped
    args, kwargs = _inputs(model, example_inputs)
    scorer, ignored = check_arguments(ratio, importance, arguments.ignore, round_to, grouped)
    pinned = _module_names(model, ignored)
    on_meta = _refuse_meta(model, args, kwargs, masked=ratio is None)
    name = _importance_name(importance or "magnitude")
    with eval_mode(model), Snapshot(model) as snapshot:  # any failure, from planning to the config: as it was
        exported = capture_model(model, args, kwargs, on_meta=on_meta)
        if scorer is not None:
            with _values_needed(name, on_meta):
                scorer.prepare(model, args, kwargs)
        choose = _by_masks(pruning_masks(model)) if ratio is None else _by_ratio(scorer, name, ratio, round_to, on_meta)
        fallback = Fallback(model, by_ratio=ratio is not None)
        while True:
            outcome = attempt(
                model, (args, kwargs), exported, [*pinned, *fallback.kept], choose,
                zeros=fallback.zeros, masked=ratio is None, on_meta=on_meta, grouped=grouped,
            )  # fmt: skip
            if isinstance(outcome, Slimmed):
                break
            snapshot.restore()
            fallback.take(outcome)
        notes = [*fallback.notes, *outcome.notes]
        if not any(outcome.removed.values()) and ratio != 0:
            _nothing_removed(outcome.groups, ratio, round_to, notes)
        shapes.record(model, outcome.before)
        run = None if config_by_shapes else (lambda m: tensors(forward(m, args, kwargs)))
        rewritten = rewrite_config(model, outcome.before, run, outcome.outputs)
    report = SlimReport(
        ratio=ratio,
        importance=None if ratio is None else name,
        params_before=outcome.params[0],
        params_after=outcome.params[1],
        macs_before=outcome.macs[0],
        macs_after=outcome.macs[1],
        groups=sum(1 for group in outcome.groups if group.size > 1 and group.removable),
        removed=sum(len(units) for units in outcome.removed.values()),
        changes=outcome.changes,
        notes=notes,
        config_rewritten=rewritten,
    )
    return report, outcome.keep


def _by_masks(masks: dict[str, Tensor]) -> Chooser:
    def choose(groups: list[Group], graph: DependencyGraph, values: dict[str, Tensor], zeros: bool) -> Chosen:
        return choose_pruned(groups, graph, values, masks, zeros=zeros)

    return choose


def _by_ratio(scorer: Importance | None, name: str, ratio: float, round_to: int, on_meta: bool) -> Chooser:
    assert scorer is not None

    def choose(groups: list[Group], graph: DependencyGraph, values: dict[str, Tensor], zeros: bool) -> Chosen:
        scores = _scorer(scorer, name, values, on_meta)
        notes: list[str] = []
        return Chosen(_lowest_units(groups, scores, ratio, round_to, graph, notes), notes=notes)

    return choose


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
    ratio: float | None,
    importance: str | Importance | None,
    ignore: Sequence[str | nn.Module],
    round_to: int,
    grouped: str = "whole",
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
    if grouped not in GROUPED:
        choices = " or ".join(repr(choice) for choice in GROUPED)
        raise ArgumentError(
            lambda say: f"{say('grouped', grouped)} is not a way to slim grouped convolutions: {choices}"
        )
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
    groups: list[Group],
    score: Callable[[Group], Tensor],
    ratio: float,
    round_to: int,
    graph: DependencyGraph,
    notes: list[str],
) -> dict[int, set[int]]:
    """Per group, the units removed: the lowest-ranked removable ones, in :func:`removal_order` (NaN first).

    A share keeps a multiple of ``round_to`` units, and of what the graph's
    aligned dimensions need (:meth:`DependencyGraph.multiple`); ``notes`` says
    where the latter kept more.

    A group several layers make side by side (a concatenation of branches)
    loses ``ratio`` of each layer's units, as each of those layers would on
    its own: ranked across the whole group, the importances of layers of other
    shapes (a 3x3 branch beside a 1x1) are not on one scale, and a branch
    could be cut to one channel while another keeps all of its own.
    """
    removed: dict[int, set[int]] = {}
    for g, group in enumerate(groups):
        order = removal_order(score(group))
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order))  # a unit's place in the removal order: higher stays longer
        ordered, removable = order.tolist(), set(group.removable)
        gone: set[int] = set()
        multiple = math.lcm(round_to, graph.multiple(group.units))
        for share in _shares(group, graph.producers):
            candidates = share & removable
            kept = _units_kept(len(share), ratio, multiple)
            count = min(len(share) - kept, len(candidates))
            if kept > _units_kept(len(share), ratio, round_to):
                maker = next((key for key in group.members if key in graph.producers), next(iter(group.members)))
                name = maker[0].removesuffix("_orig")
                notes.append(f"'{name}' keeps {kept} of {len(share)} channels: {_WHOLE_16_BYTES}")
            if count > 0:
                gone |= set([unit for unit in ordered if unit in candidates][:count])
        if not gone:
            continue
        for unit_index in group.members.values():  # every tensor dimension keeps a position
            units = set(unit_index.unique().tolist())
            if units <= gone:
                gone.discard(max(units, key=lambda k: int(rank[k])))
        removed[g] = gone
    return removed


_WHOLE_16_BYTES = "a grouped matrix product reads it, in widths of whole 16 bytes"


def _shares(group: Group, producers: set[TensorDim]) -> list[set[int]]:
    """The group's units split by the layers making them: one share where every unit has the same makers."""
    makers: dict[int, list[TensorDim]] = {unit: [] for unit in range(group.size)}
    for key, unit_index in group.members.items():
        if key in producers:
            for unit in unit_index.unique().tolist():
                makers[unit].append(key)
    shares: dict[tuple[TensorDim, ...], set[int]] = {}
    for unit, keys in makers.items():
        shares.setdefault(tuple(sorted(keys)), set()).add(unit)
    return list(shares.values())


def _units_kept(size: int, ratio: float, round_to: int) -> int:
    """How many of ``size`` units a ``ratio`` keeps: the mask rule's count (half to even), then up to ``round_to``."""
    keep = size - count_for(ratio, size)
    return min(size, max(1, math.ceil(keep / round_to) * round_to))


def _largest(groups: list[Group]) -> int:
    return max(group.size for group in groups)


def _nothing_removed(groups: list[Group], ratio: float | None, round_to: int, notes: list[str]) -> None:
    """Warn (and note) that slimming removed nothing, and why, rather than write an unchanged model in silence."""
    if ratio is None:
        why = (
            "no channel is pruned whole (its rows or filters at zero in every layer that makes it); "
            "pass ratio= (say ratio=0.3) to remove that share of every group's channels, the lowest by importance"
        )
    elif not groups:
        why = "every channel is kept whole (an ignored module, a model input or output, an operation not followed)"
    elif all(_units_kept(group.size, ratio, 1) == group.size for group in groups):
        why = f"ratio {ratio:g} of a group rounds to no unit (the largest group has {_largest(groups)})"
    else:
        kept_by = f"round_to={round_to}"
        if any(note.endswith(_WHOLE_16_BYTES) for note in notes):
            kept_by += ", or the widths a grouped matrix product reads,"
        why = f"{kept_by} keeps every group whole: the largest has {_largest(groups)} units"
    message = f"slimming removed nothing: {why}"
    notes.append(message)
    warnings.warn(message, UserWarning, stacklevel=3)
