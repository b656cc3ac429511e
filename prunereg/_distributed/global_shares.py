"""The local view of a global pruning over DTensors: each rank's shards as one vector spread over the ranks.

Global pruning (:mod:`prunereg._core.global_pruning`) owns the dispatch: for
DTensors it asks :func:`local_view` for the local shards of every tensor, score
and earlier mask and a :class:`~prunereg._distributed.vectors.SpreadVector`,
computes each local share as it would in one process, and :func:`wrap_shares`
turns the local shares back into DTensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from prunereg._distributed.layout import same_sharding, to_shards_of, wrap
from prunereg._distributed.vectors import SpreadVector

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


class Entry(NamedTuple):
    """One tensor of a global pruning: the tensor, the scores ranking its entries, its current mask (None: unpruned)."""

    tensor: torch.Tensor
    scores: torch.Tensor
    old_mask: torch.Tensor | None


class LocalView(NamedTuple):
    """This rank's part of a global pruning over DTensors."""

    entries: list[Entry]  # the local shards of every tensor, score and earlier mask
    spread: SpreadVector  # makes one vector spread over the ranks of the local parts
    tensors: list[DTensor]  # the DTensors, checked to be sharded alike


def local_view(entries: Sequence[Entry]) -> LocalView:
    """The local shards of ``entries`` (DTensors sharded alike); plain scores and masks are cut into their shards."""
    tensors = same_sharding([entry.tensor for entry in entries])
    scores = [to_shards_of(entry.scores, t) for entry, t in zip(entries, tensors)]
    local = [
        Entry(
            t.to_local(),
            s.to_local(),
            None if entry.old_mask is None else to_shards_of(entry.old_mask, t).to_local(),
        )
        for entry, t, s in zip(entries, tensors, scores)
    ]
    return LocalView(local, SpreadVector(tensors[0], scores), tensors)


def wrap_shares(shares: Sequence[torch.Tensor], view: LocalView) -> list[torch.Tensor]:
    """The local ``shares`` of a :func:`local_view` as DTensors laid out like their tensors."""
    return [wrap(share, t) for share, t in zip(shares, view.tensors)]
