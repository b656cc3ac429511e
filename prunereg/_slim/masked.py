"""Slimming without a ratio: the channels the masks pruned go, and exact zeros that can go without a change.

One rule, per unit (a channel with everything coupled to it, a head, a
convolution group; :mod:`.groups`):

- **a mask decides**: a unit whose rows or filters a ``<name>_mask`` zeroes in
  some layer that makes it, or whose input columns a mask zeroes in some layer
  that reads it, is pruned and must go. If a coupled layer still makes or
  reads it (not at zero), or it cannot go at all (a model output, an ignored
  module), slimming is refused, naming the masked layer, the layer that keeps
  the unit and the operations coupling them (a residual add, a gated product,
  a depthwise convolution, a shared input...).
- **exact zeros, no mask**: a unit that every layer making it makes as exact
  zeros (or every layer reading it reads with exact zeros) goes when it can:
  one that cannot (a zero-initialised output head, an embedding row looked up
  by index) stays, and the report notes it; this never refuses. The engine
  also keeps them when removing them would change the outputs (a bias, a
  norm's shift, a statistic over the channels): :attr:`~.groups.Chosen.by_zeros`.

A unit's entries in a tensor are "zero" when every entry is exactly zero in
the tensor the model computes with (``orig * mask`` for a pruned one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from prunereg._slim.graph import READS, SAME, DependencyGraph, SlimError
from prunereg._slim.groups import Chosen, Group, TensorDim


@dataclass
class _Side:
    """The layers on one side of a group's units (those making them, or those reading them)."""

    keys: list[TensorDim]
    held: Tensor
    """``(layers, units)``: whether the layer's dimension holds the unit at all."""
    zero: Tensor
    """``(layers, units)``: whether it holds only zeros of it (False where not held)."""
    masked: Tensor
    """``(layers, units)``: whether a mask zeroes every entry of it (False where not held, or no mask)."""

    def all_zero(self) -> Tensor:
        """Per unit: some layer holds it, and every layer holding it holds zeros."""
        if not self.keys:
            return torch.zeros(self.held.shape[1], dtype=torch.bool)
        return self.held.any(0) & (self.zero | ~self.held).all(0)


def choose_pruned(
    groups: list[Group],
    graph: DependencyGraph,
    values: Mapping[str, Tensor],
    masks: Mapping[str, Tensor],
    *,
    zeros: bool = True,
) -> Chosen:
    """The units to remove without a ratio, by the rule above; ``zeros=False`` keeps every unit no mask chose."""
    choice = Chosen({})
    for g, group in enumerate(groups):
        made = _side(group, graph.producers, values, masks)
        read = _side(group, graph.consumers, values, masks)
        decided = made.masked.any(0) | read.masked.any(0)
        can_go = made.all_zero() | read.all_zero()
        pinned = torch.tensor([reason is not None for reason in group.pinned], dtype=torch.bool)
        for k in (decided & ~can_go).nonzero().flatten().tolist():
            raise _kept_by_a_coupled_layer(group, graph, made, read, k)
        for k in (decided & pinned).nonzero().flatten().tolist():
            raise SlimError(f"{_unit_text(group, k, _decider(made, read, k))} is pruned, but cannot be removed: "
                            f"{group.pinned[k]}")  # fmt: skip
        plain = can_go & ~decided & ~pinned if zeros else torch.zeros_like(decided)
        _note_zeros_that_stay(group, made, can_go & ~decided & pinned, choice.notes)
        chosen = decided | plain
        for key, unit_index in group.members.items():
            if bool(chosen[unit_index].all()):
                if bool(decided[unit_index].any()):
                    raise SlimError(
                        f"every channel of {_tensor_text(key[0])} (dim {key[1]}) is pruned: slimming would leave none"
                    )
                chosen &= decided  # exact zeros only: every channel of a layer at zero stays
                choice.notes.append(f"every channel of {_tensor_text(key[0])} (dim {key[1]}) is zero: they stay")
                break
        partial = _partially_zero(group, made, values, masks, chosen)
        if partial:
            choice.notes.append(partial)
        chosen = _aligned(group, graph, made, chosen, decided, choice.notes)
        if chosen.any():
            choice.removed[g] = set(chosen.nonzero().flatten().tolist())
            by_zeros = chosen & ~decided
            if by_zeros.any():
                choice.by_zeros[g] = set(by_zeros.nonzero().flatten().tolist())
    return choice


def _aligned(
    group: Group, graph: DependencyGraph, made: _Side, chosen: Tensor, decided: Tensor, notes: list[str]
) -> Tensor:
    """``chosen`` less the fewest units that leave a width a grouped matrix product can read (exact zeros first).

    The units that stay hold zeros where they are made or read, so the
    outputs are the masked model's still.
    """
    multiple = graph.multiple(group.units)
    kept = group.size - int(chosen.sum())
    extra = min(group.size, -(-kept // multiple) * multiple) - kept
    if extra <= 0:
        return chosen
    ordered = [*(chosen & ~decided).nonzero().flatten().tolist(), *(chosen & decided).nonzero().flatten().tolist()]
    aligned = chosen.clone()
    aligned[ordered[:extra]] = False
    maker = next(iter(made.keys or group.members))[0]
    notes.append(
        f"{extra} pruned channels of {_tensor_text(maker)} stay, at zero: "
        f"a grouped matrix product reads them, in widths of whole 16 bytes"
    )
    return aligned


def _side(group: Group, dims: set[TensorDim], values: Mapping[str, Tensor], masks: Mapping[str, Tensor]) -> _Side:
    keys = [key for key in group.members if key in dims and key[0] in values]
    held, zero, masked = [], [], []
    for key in keys:
        unit_index = group.members[key]
        here = torch.bincount(unit_index, minlength=group.size) > 0
        held.append(here)
        zero.append(here & _units_without_nonzeros(values[key[0]], key[1], unit_index, group.size))
        mask = masks.get(key[0])
        no_mask = torch.zeros(group.size, dtype=torch.bool)
        masked.append(here & _units_without_nonzeros(mask, key[1], unit_index, group.size) if mask is not None
                      else no_mask)  # fmt: skip
    empty = torch.zeros(0, group.size, dtype=torch.bool)
    stack = lambda rows: torch.stack(rows) if rows else empty  # noqa: E731
    return _Side(keys, stack(held), stack(zero), stack(masked))


def _units_without_nonzeros(value: Tensor, dim: int, unit_index: Tensor, units: int) -> Tensor:
    """Per unit: whether none of its positions along ``dim`` holds a nonzero entry (True for a unit not there)."""
    nonzero = value.ne(0)
    if nonzero.dim() > 1:
        nonzero = nonzero.any(dim=[d for d in range(nonzero.dim()) if d != dim])
    count = torch.zeros(units, dtype=torch.long).index_add_(0, unit_index, nonzero.long().cpu())
    return count == 0


def _decider(made: _Side, read: _Side, k: int) -> TensorDim:
    """The masked layer that pruned unit ``k``: one making it, else one reading it."""
    for side in (made, read):
        for row, key in enumerate(side.keys):
            if bool(side.masked[row, k]):
                return key
    raise AssertionError("no mask pruned this unit")


def _kept_by_a_coupled_layer(group: Group, graph: DependencyGraph, made: _Side, read: _Side, k: int) -> SlimError:
    """The refusal of a unit a mask pruned while a coupled layer keeps it: both layers, and what couples them."""
    decider = _decider(made, read, k)
    side = made if decider in made.keys else read
    keeper = next(
        (key for row, key in enumerate(side.keys) if bool(side.held[row, k]) and not bool(side.zero[row, k])),
        None,
    )
    if keeper is None:  # pruned where it is read, kept where it is made: the layers making it
        other = read if side is made else made
        keeper = next(
            key for row, key in enumerate(other.keys) if bool(other.held[row, k]) and not bool(other.zero[row, k])
        )
    path = graph.ids.path(_ids_of(group, graph, decider, k), _ids_of(group, graph, keeper, k))
    how = f" ({describe_couplings(path)} couples them)" if path else ""
    return SlimError(
        f"{_unit_text(group, k, decider)} is pruned by its mask, but {_tensor_text(keeper[0])} keeps it{how}: "
        "prune it there too, or not at all"
    )


def _ids_of(group: Group, graph: DependencyGraph, key: TensorDim, k: int) -> Tensor:
    positions = (group.members[key] == k).nonzero().flatten()
    return graph.tensors[key[0]][key[1]][positions]


def describe_couplings(path: list[str]) -> str:
    """Couplings recorded by the graph, in words: "a residual add in 'block', then the depthwise convolution 'dw'"."""
    phrases: list[str] = []
    readers: list[str] = []

    def flush() -> None:
        if len(readers) > 1:
            phrases.append(f"a shared input of {' and '.join(dict.fromkeys(readers))}")
        elif readers:
            phrases.append(f"the input of {readers[0]}")
        readers.clear()

    for step in path:
        kind, _, where = step.partition("\t")
        if kind == SAME:
            continue
        if kind == READS:
            readers.append(where)
            continue
        flush()
        phrase = f"{kind} {where}" if kind.startswith("the ") else f"{kind} in {where}"
        if not phrases or phrases[-1] != phrase:
            phrases.append(phrase)
    flush()
    return ", then ".join(phrases)


def _note_zeros_that_stay(group: Group, made: _Side, staying: Tensor, notes: list[str]) -> None:
    if not staying.any():
        return
    k = int(staying.nonzero()[0])
    key = next((key for row, key in enumerate(made.keys) if bool(made.held[row, k])), None)
    if key is None:
        key = next(key for key, unit_index in group.members.items() if bool((unit_index == k).any()))
    count = int(staying.sum())
    what = f"{count} zero channels" if count > 1 else "a zero channel"
    notes.append(f"{what} of {_tensor_text(key[0])} (dim {key[1]}) stay, as no mask pruned them: {group.pinned[k]}")


def _partially_zero(
    group: Group, made: _Side, values: Mapping[str, Tensor], masks: Mapping[str, Tensor], chosen: Tensor
) -> str | None:
    """A note when masked rows stay because the rest of their unit (a head, a convolution group) is not pruned."""
    gone = chosen.nonzero().flatten()
    for key in made.keys:
        if key[0] not in masks:
            continue
        rows = values[key[0]].ne(0)
        if rows.dim() > 1:
            rows = rows.any(dim=[d for d in range(rows.dim()) if d != key[1]])
        zero_positions = int((~rows).sum())
        removed_positions = int(torch.isin(group.members[key], gone).sum())
        if zero_positions > removed_positions:
            return (
                f"{zero_positions - removed_positions} pruned channels of {_tensor_text(key[0])} stay: "
                "each belongs to a unit (a head, a convolution group) that is not entirely pruned"
            )
    return None


def _tensor_text(name: str) -> str:
    return f"'{name.removesuffix('_orig')}'"


def _unit_text(group: Group, k: int, key: TensorDim) -> str:
    positions = (group.members[key] == k).nonzero().flatten().tolist()
    where = f"position {positions[0]}" if len(positions) == 1 else f"positions {positions[0]}..{positions[-1]}"
    return f"{where} of {_tensor_text(key[0])} (dim {key[1]})"
