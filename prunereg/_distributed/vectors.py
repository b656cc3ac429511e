"""Each rank's part of a vector as one 1-D DTensor spread over the ranks, and the draws it stands for.

A method that sees "the entries earlier pruning left, as one vector" (a
``PruningContainer``, global pruning) gets such a vector on DTensors. Built
from the kept entries of source tensors, it remembers them, so that
:func:`prunereg._distributed.draws.rand_like` of it gives the draws of the
sources' full streams at those entries, as in one process.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from prunereg._distributed.collectives import sum_over_shards

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

# The vectors of kept entries that SpreadVector built, by id, with their
# sources and kept entries. An entry lives as long as its vector.
_DRAW_SOURCES: dict[int, list[tuple[DTensor, torch.Tensor | None]]] = {}


def draw_sources(vector: torch.Tensor) -> list[tuple[DTensor, torch.Tensor | None]] | None:
    """The sources and kept entries (flat flags over their local shards; None: all) ``vector`` was built from."""
    return _DRAW_SOURCES.get(id(vector))


class SpreadVector:
    """Turns each rank's part of a vector into one 1-D DTensor spread over the ranks.

    Its length is the sum over the ranks holding distinct shards of ``like``
    (replicas count once). Given the kept entries of each of ``sources`` (flat
    flags over their local shards), the vector draws random numbers at those
    entries of the sources' full streams.
    """

    def __init__(self, like: DTensor, sources: Sequence[DTensor]) -> None:
        self.like = like
        self.sources = sources
        self.length: int | None = None

    def __call__(self, local: torch.Tensor, keeps: Sequence[torch.Tensor | None] | None = None) -> DTensor:
        from torch.distributed.tensor import DTensor, Replicate, Shard

        local = local.reshape(-1)
        if self.length is None:
            count = torch.tensor([local.numel()], dtype=torch.int64, device=local.device)
            self.length = int(sum_over_shards(count, self.like))
        placements = [Shard(0) if p.is_shard() else Replicate() for p in self.like.placements]
        vector = DTensor.from_local(
            local, self.like.device_mesh, placements, run_check=False, shape=torch.Size([self.length]), stride=(1,)
        )
        if keeps is not None:
            _DRAW_SOURCES[id(vector)] = list(zip(self.sources, keeps))
            weakref.finalize(vector, _DRAW_SOURCES.pop, id(vector), None)
        return vector
