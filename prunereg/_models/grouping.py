"""A sparsity summary grouped by block or by type, for models with hundreds of tensors.

Names say where a tensor sits: ``model.layers.3.self_attn.q_proj.weight`` is in
block ``model.layers.3`` (the name up to its first layer number) and of type
``model.layers.*.self_attn.q_proj.weight`` (the name with every layer number
as ``*``: the same tensor in every block). A name without a layer number is a
block of its own module (``model.embed_tokens``, ``lm_head``) and a type of its
own. Grouping goes by names only, so a model in Python and its file on disk
group alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prunereg._models.table import aligned, bar, percent
from prunereg._text import printable

BY = ("block", "type")
"""The groupings: ``"block"`` (one row per layer) and ``"type"`` (one row per tensor of a layer, over all layers)."""

_LAYER_NUMBER = re.compile(r"(?<![^.])\d+(?![^.])")  # a whole dotted part made of digits


class Row(Protocol):
    """What grouping needs of a summary row."""

    @property
    def name(self) -> str: ...
    @property
    def numel(self) -> int: ...
    @property
    def zeros(self) -> int: ...
    @property
    def pruned_by(self) -> tuple[str, ...]: ...


def group_name(name: str, by: str) -> str:
    """The group of tensor ``name``: its block (``by="block"``) or its type (``by="type"``)."""
    if by == "type":
        return _LAYER_NUMBER.sub("*", name)
    if by != "block":
        raise ValueError(f"by must be one of {', '.join(map(repr, BY))}, not {by!r}")
    number = _LAYER_NUMBER.search(name)
    if number is not None:
        return name[: number.end()]
    module, dot, _ = name.rpartition(".")
    return module if dot else name


@dataclass(frozen=True)
class GroupSummary:
    """One group: its name, how many tensors it holds, their entries and zeros, and the methods that pruned them."""

    name: str
    tensors: int
    numel: int
    zeros: int
    pruned_by: tuple[str, ...] = ()

    @property
    def sparsity(self) -> float:
        return self.zeros / self.numel if self.numel else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tensors": self.tensors,
            "numel": self.numel,
            "zeros": self.zeros,
            "sparsity": self.sparsity,
            "pruned_by": list(self.pruned_by),
        }


@dataclass(frozen=True)
class GroupedSummary:
    """Rows of :class:`GroupSummary` in order of first appearance, and their totals; ``str()`` is a table."""

    by: str
    groups: tuple[GroupSummary, ...]

    @property
    def numel(self) -> int:
        return sum(group.numel for group in self.groups)

    @property
    def zeros(self) -> int:
        return sum(group.zeros for group in self.groups)

    @property
    def sparsity(self) -> float:
        return self.zeros / self.numel if self.numel else 0.0

    def as_dicts(self) -> list[dict[str, Any]]:
        return [group.as_dict() for group in self.groups]

    def as_dict(self) -> dict[str, Any]:
        """Groups and totals, as ``prunereg report --by ... --json`` prints them."""
        total = {"numel": self.numel, "zeros": self.zeros, "sparsity": self.sparsity}
        return {"by": self.by, "groups": self.as_dicts(), "total": total}

    def __str__(self) -> str:
        with_methods = any(group.pruned_by for group in self.groups)
        header = [self.by.upper(), "TENSORS", "NUMEL", "ZEROS", "SPARSITY", ""] + (
            ["PRUNED BY"] if with_methods else []
        )
        lines: list[Sequence[str]] = [header]
        for group in self.groups:
            line = [printable(group.name), str(group.tensors), f"{group.numel:,}", f"{group.zeros:,}"]
            line += [percent(group.sparsity), bar(group.sparsity)]
            lines.append(line + ([printable("+".join(group.pruned_by))] if with_methods else []))
        tensors = sum(group.tensors for group in self.groups)
        total = [
            "total",
            str(tensors),
            f"{self.numel:,}",
            f"{self.zeros:,}",
            percent(self.sparsity),
            bar(self.sparsity),
        ]
        lines.append(total + ([""] if with_methods else []))
        return aligned(lines, right_aligned={1, 2, 3, 4})


def grouped(rows: Iterable[Row], by: str) -> GroupedSummary:
    """``rows`` summed per group (see :func:`group_name`); methods listed once per group, in order of appearance."""
    names: dict[str, list[Row]] = {}
    for row in rows:
        names.setdefault(group_name(row.name, by), []).append(row)
    groups = tuple(
        GroupSummary(
            name,
            len(members),
            sum(row.numel for row in members),
            sum(row.zeros for row in members),
            tuple(dict.fromkeys(method for row in members for method in row.pruned_by)),
        )
        for name, members in names.items()
    )
    return GroupedSummary(by, groups)
