"""Selecting the k smallest entries (unstructured and global pruning) of plain tensors and DTensors."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prunereg._distributed.collectives import exclusive_prefix, sum_over_shards
from prunereg._distributed.layout import is_dtensor, local_shard, same_sharding, to_shards_of, wrap
from prunereg._selection import select as plain


def select_k(
    chunks: Sequence[torch.Tensor], k: int, *, largest: bool = False, magnitude: bool = False
) -> list[torch.Tensor]:
    """Mark the ``k`` smallest (or largest) entries of all ``chunks`` taken together.

    Returns one bool tensor per chunk, of its shape and on its device, True where
    the entry is selected. Exactly ``k`` entries are selected; NaN counts as the
    smallest value; entries tied at the threshold are taken in chunk order, then
    by flat index. The chunks may live on different devices and have different
    dtypes (compared in their promoted dtype, as ``torch.cat`` would).
    ``magnitude=True`` ranks ``torch.abs`` of the entries without making that copy.

    DTensor chunks (all sharded alike) are selected shard by shard: each rank
    searches its own shards, the histograms are summed over the ranks holding
    distinct shards, so all find the same threshold, and ties are taken in rank
    order, then in each rank's order.
    """
    if not is_dtensor(chunks[0]):
        return plain.select_k(chunks, k, largest=largest, magnitude=magnitude)
    return _sharded_select_k(chunks, k, largest=largest, magnitude=magnitude)


def _sharded_select_k(
    plain_or_sharded: Sequence[torch.Tensor], k: int, *, largest: bool, magnitude: bool
) -> list[torch.Tensor]:
    chunks = same_sharding(plain_or_sharded)
    like = chunks[0]
    collectives = plain.Collectives(
        total=sum(chunk.numel() for chunk in chunks),
        all_reduce=lambda counts: sum_over_shards(counts, like),
        exclusive_prefix=lambda ties: exclusive_prefix(ties, like),
    )
    local = plain.select_spread(
        [chunk.to_local() for chunk in chunks], k, collectives, largest=largest, magnitude=magnitude
    )
    return [wrap(flags, chunk) for flags, chunk in zip(local, chunks)]


def prune_lowest(
    scores: torch.Tensor,
    k: int,
    default_mask: torch.Tensor,
    *,
    largest: bool = False,
    magnitude: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """A new mask: ``default_mask`` with zeros also at the ``k`` lowest ``scores``.

    ``largest=True`` prunes the highest scores instead, ``magnitude=True`` ranks
    ``|scores|``. This is what prunereg's own ``l1_unstructured`` returns: exactly
    ``k`` entries (those :func:`select_k` selects), NaN pruned first, ties broken
    by position, no sort on large tensors, works on every device including
    ``meta``, and on DTensors shard by shard. ``out``, a contiguous tensor of
    ``default_mask``'s shape and dtype, may receive the mask instead of new
    memory; it may be ``scores`` itself, which is then overwritten. Use the
    returned tensor.
    """
    if k == 0 or not is_dtensor(scores):
        return plain.prune_lowest(scores, k, default_mask, largest=largest, magnitude=magnitude, out=out)
    (selected,) = _sharded_select_k([scores], k, largest=largest, magnitude=magnitude)
    mask = to_shards_of(default_mask, scores)
    return wrap(plain.clear_selected(mask.to_local(), local_shard(selected)), scores)
