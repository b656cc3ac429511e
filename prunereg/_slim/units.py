"""A dependency group as importances see it: the units a ratio is taken of, and the tensor positions each holds.

Its own module, with torch as its only import, so that :mod:`prunereg.toolkit`
publishes :class:`Group` without loading ``torch.export`` for every plugin.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

TensorDim = tuple[str, int]
"""A parameter or buffer name and one of its dimensions."""


@dataclass
class Group:
    """Units that share tensor dimensions; ``members`` maps each such dimension to the unit of every position."""

    units: list[int]
    """The units' ids (roots of their classes), in order of first appearance."""
    members: dict[TensorDim, Tensor] = field(default_factory=dict)
    """``(tensor, dim)`` to a ``long`` tensor as long as that dimension: the index in ``units`` of each position."""
    pinned: list[str | None] = field(default_factory=list)
    """Per unit: why it must stay (``None``: it may go)."""

    @property
    def removable(self) -> list[int]:
        """Indices (in ``units``) of the units that may be removed."""
        return [k for k, reason in enumerate(self.pinned) if reason is None]

    @property
    def size(self) -> int:
        return len(self.units)

    def channel_count(self) -> int:
        """How many positions the group's widest dimension has (its channel count, for reports)."""
        return max((len(index) for index in self.members.values()), default=0)
