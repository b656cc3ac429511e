"""Dependency groups: the channels that are removed together, and the tensor positions each one holds.

A *unit* is one class of coupled positions (:mod:`prunereg._slim.ids`): a
channel of a residual stream with every row, column and norm entry that
follows it, a whole attention head, a whole group of a grouped convolution.
A *group* is the set of units that share tensor dimensions (the 768 channels
of BERT's residual stream, the 12 heads of one attention layer), the set a
``ratio`` is taken of. A unit can be removed when nothing pins it and it
holds the output rows of some layer (a unit that no layer makes is no channel).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from prunereg._bytes import tensor_buffer
from prunereg._slim.graph import DependencyGraph
from prunereg._slim.ids import Ids
from prunereg._slim.units import Group, TensorDim


@dataclass
class Chosen:
    """The units slimming removes (group index to unit indices), those among them only exact zeros chose, notes."""

    removed: dict[int, set[int]]
    by_zeros: dict[int, set[int]] = field(default_factory=dict)
    """Units no mask chose: kept (and tried again) if removing them changes the outputs."""
    notes: list[str] = field(default_factory=list)


def find_groups(graph: DependencyGraph, *, every: bool = False) -> list[Group]:
    """The groups of ``graph`` with at least two units, one of them removable, in the order the model makes them.

    ``every``: all groups, also those that must stay whole (to tell why pruned channels cannot go).
    """
    ids = graph.ids
    everything = ids.all_roots()
    roots: dict[TensorDim, Tensor] = {
        (name, dim): everything[positions]
        for name, dims in graph.tensors.items()
        for dim, positions in enumerate(dims)
        if positions.numel() > 1
    }
    produced = {int(r) for key in graph.producers if key in roots for r in roots[key].unique().tolist()}
    linked = Ids()
    slot: dict[int, int] = {}
    order: list[int] = []
    uniques: dict[TensorDim, tuple[Tensor, Tensor, bytes]] = {}
    seen: set[bytes] = set()
    for key, unit_ids in roots.items():
        unique, inverse = torch.unique(unit_ids, return_inverse=True)
        signature = bytes(tensor_buffer(unique))  # coupled tensors (a layer's rows, its norm, ...) hold the same units
        uniques[key] = (unique, inverse, signature)
        if signature in seen:
            continue
        seen.add(signature)
        members = unique.tolist()
        new = [unit for unit in members if unit not in slot]
        slot.update(zip(new, range(len(order), len(order) + len(new)), strict=True))
        order.extend(new)
        linked.fresh(len(new))  # slot k is id k of linked
        slots = torch.tensor([slot[unit] for unit in members], dtype=torch.int64)
        linked.union_arrays(slots[:1].expand(len(members) - 1), slots[1:])
    group_of = linked.all_roots().tolist()
    by_group: dict[int, Group] = {}
    for unit in order:
        root = group_of[slot[unit]]
        group = by_group.get(root)
        if group is None:
            group = by_group[root] = Group([])
        group.units.append(unit)
        reason = ids.pin_reason(unit)
        if reason is None and unit not in produced:
            reason = "no layer makes this channel"
        group.pinned.append(reason)
    kept = {root: g for root, g in by_group.items() if every or (g.size > 1 and g.removable)}
    indices = {root: {unit: k for k, unit in enumerate(g.units)} for root, g in kept.items()}
    positions: dict[bytes, Tensor] = {}
    for key, (unique, inverse, signature) in uniques.items():
        root = group_of[slot[int(unique[0])]]
        if root in kept:
            if signature not in positions:
                index = indices[root]
                positions[signature] = torch.tensor([index[u] for u in unique.tolist()], dtype=torch.long)
            kept[root].members[key] = positions[signature][inverse]
    return list(kept.values())


def kept_positions(groups: list[Group], removed: dict[int, set[int]]) -> dict[TensorDim, Tensor]:
    """Per tensor dimension that loses positions, the sorted positions it keeps (``removed``: group index to units)."""
    keep: dict[TensorDim, Tensor] = {}
    for g, units in removed.items():
        if not units:
            continue
        gone = torch.tensor(sorted(units), dtype=torch.long)
        for key, unit_index in groups[g].members.items():
            stays = ~torch.isin(unit_index, gone)
            if not bool(stays.all()):
                keep[key] = stays.nonzero().flatten()
    return keep
