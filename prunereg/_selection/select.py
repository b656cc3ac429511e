"""Choosing the k entries to prune of plain tensors: the selection policy every method shares.

Every built-in method goes through :func:`select_k`, :func:`prune_lowest` or
:func:`top_indices` (sharded tensors through their counterparts in
:mod:`prunereg._distributed`, which run the same search per shard).

Small inputs (at most ``TOPK_CUTOFF`` entries) use ``torch.topk``, as
``torch.nn.utils.prune`` does but without sorting what it picks (the same
entries), so their masks equal torch's, ties included;
:func:`uses_topk` is the one place that decides. Larger inputs never sort: the
radix select of :mod:`prunereg._selection.radix` finds the threshold, streamed in blocks
of ``BLOCK`` entries.

The selected entries are those strictly below the threshold (above it for
``largest=True``), plus as many entries equal to it as needed to make exactly
k, taken in stream order: the first chunk first, and within a chunk by
increasing flat (row-major) index. That tie rule is deterministic and the same
on every device; wherever no two candidates tie at the threshold, the mask is
torch's. NaN scores count as the smallest: they are pruned first (``topk`` would
keep them), and for ``largest=True`` they are chosen last.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence

import torch

from prunereg._selection.radix import (
    Marker,
    Threshold,
    Workspace,
    find_threshold,
    flat_order_keys,
    key_dtype,
    key_width,
    order_keys,
    promoted_dtype,
)
from prunereg._selection.threads import bounded_threads

# Entries up to which torch.topk is used: identical to torch there, and faster
# than the radix select's fixed cost (its 65536-bin histograms, about 0.2 ms).
# Measured on the 2-core CPU machines for k = n/2: float32 topk 0.24 ms against
# radix 0.25 ms at 8192 entries, 0.53 against 0.27 ms at 16384 (bfloat16 crosses
# a little lower). CUDA takes the same cutoff, unmeasured, so that inputs past it
# get the same masks on both devices, ties included.
TOPK_CUTOFF = {"cpu": 1 << 13, "cuda": 1 << 13}
_DEFAULT_CUTOFF = 1 << 13
_SMALLEST_CUTOFF = min(_DEFAULT_CUTOFF, *TOPK_CUTOFF.values())  # below it, topk on every device (no lookup)

# Entries per block when streaming: the temporaries of one pass stay this small.
BLOCK = 1 << 22


def uses_topk(numel: int, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``numel`` entries of ``dtype`` on ``device`` are selected with ``torch.topk`` (not the radix select).

    Small inputs take ``topk``, as torch does; so do dtypes without order-preserving integer keys.
    """
    return numel <= TOPK_CUTOFF.get(device.type, _DEFAULT_CUTOFF) or key_dtype(dtype) is None


@dataclasses.dataclass(frozen=True)
class Collectives:
    """A selection spread over processes, each holding some of the entries (see :mod:`prunereg._selection.radix`)."""

    total: int  # entries in all processes together
    all_reduce: Callable[[torch.Tensor], torch.Tensor]
    exclusive_prefix: Callable[[torch.Tensor], torch.Tensor]


def select_k(
    chunks: Sequence[torch.Tensor], k: int, *, largest: bool = False, magnitude: bool = False
) -> list[torch.Tensor]:
    """Mark the ``k`` smallest (or largest) entries of all ``chunks`` taken together.

    Returns one bool tensor per chunk, of its shape and on its device, True where
    the entry is selected. Exactly ``k`` entries are selected, ties broken as the
    module docstring says; NaN counts as the smallest value. The chunks may live
    on different devices and have different dtypes (compared in their promoted
    dtype, as ``torch.cat`` would). ``magnitude=True`` ranks ``torch.abs`` of the
    entries without making that copy. Plain tensors only: DTensors go through
    :func:`prunereg._distributed.select_k`.
    """
    return select_spread(chunks, k, None, largest=largest, magnitude=magnitude)


def select_spread(
    chunks: Sequence[torch.Tensor],
    k: int,
    collectives: Collectives | None,
    *,
    largest: bool = False,
    magnitude: bool = False,
) -> list[torch.Tensor]:
    """:func:`select_k` of this process's ``chunks``, the entries being spread over processes.

    ``k`` counts in all processes; every process calls this with the same
    ``collectives`` (None: all entries are here, and small inputs use ``topk``).
    """
    flat = [chunk.reshape(-1) for chunk in chunks]
    total = sum(f.numel() for f in flat) if collectives is None else collectives.total
    if not 0 <= k <= total:
        raise ValueError(f"cannot select k={k} of {total} entries")
    if any(f.is_meta for f in flat):
        return [torch.zeros(c.shape, dtype=torch.bool, device="meta") for c in chunks]
    dtype = promoted_dtype(flat)
    if k == 0:
        return [torch.zeros(c.shape, dtype=torch.bool, device=c.device) for c in chunks]
    if collectives is None and uses_topk(total, flat[0].device, dtype):
        if magnitude:
            flat = [f.abs() for f in flat]
        return _select_by_topk(chunks, flat, k, largest)
    with bounded_threads(min(max(f.numel() for f in flat), BLOCK), flat[0].device):
        return _select_by_radix(chunks, flat, k, dtype, collectives, largest=largest, magnitude=magnitude)


def _select_by_radix(
    chunks: Sequence[torch.Tensor],
    flat: list[torch.Tensor],
    k: int,
    dtype: torch.dtype,
    collectives: Collectives | None,
    *,
    largest: bool,
    magnitude: bool,
) -> list[torch.Tensor]:
    threshold, keys = _search(flat, k, dtype, largest=largest, magnitude=magnitude, collectives=collectives)
    if collectives is None:
        mark = Marker(threshold, keys.workspace)
    else:
        mark = Marker(threshold, keys.workspace, device=flat[0].device, **_spread(collectives))
    selected = [torch.empty(f.shape, dtype=torch.bool, device=f.device) for f in flat]
    out_blocks = [out_block for out in selected for out_block in out.split(BLOCK)]
    for block, out_block in zip(keys(flat), out_blocks):
        mark(block, out=out_block)
    for number, positions in mark.finish():
        out_blocks[number].index_fill_(0, positions.to(out_blocks[number].device), True)
    return [out.view(chunk.shape) for out, chunk in zip(selected, chunks)]


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
    ``meta``. ``out``, a contiguous tensor of ``default_mask``'s shape and dtype,
    may receive the mask instead of new memory; it may be ``scores`` itself, which
    is then overwritten. Use the returned tensor.
    """
    # Built block by block from the keys, without a mask of the selection: on
    # CPU the fresh memory of every large temporary costs more than computing it.
    if k == 0:
        return default_mask.clone(memory_format=torch.contiguous_format)
    flat = scores.reshape(-1)
    if not 0 < k <= flat.numel():
        raise ValueError(f"cannot select k={k} of {flat.numel()} entries")
    if default_mask.numel() != flat.numel():
        raise ValueError(f"default_mask has {default_mask.numel()} entries, the scores {flat.numel()}")
    if flat.is_meta:
        return clear_selected(default_mask, select_k([scores], k, largest=largest, magnitude=magnitude)[0])
    if uses_topk(flat.numel(), flat.device, flat.dtype):
        # torch's own way: a copy of the mask, zeros written at topk's indices (no bool mask of the selection).
        mask = default_mask.clone(memory_format=torch.contiguous_format)
        indices = _topk_indices(flat, k, largest, magnitude)
        if indices.device != mask.device:
            indices = indices.to(mask.device)
        return mask.view(-1).index_fill_(0, indices, 0).view(mask.shape)
    with bounded_threads(min(flat.numel(), BLOCK), flat.device):
        low, high = _min_max(default_mask)
        if not (math.isfinite(low) and math.isfinite(high)):
            return clear_selected(default_mask, select_k([scores], k, largest=largest, magnitude=magnitude)[0])
        return _prune_by_radix(
            flat, k, default_mask, largest=largest, magnitude=magnitude, all_ones=low == high == 1, out=out
        )


def _prune_by_radix(
    flat: torch.Tensor,
    k: int,
    default_mask: torch.Tensor,
    *,
    largest: bool,
    magnitude: bool,
    all_ones: bool,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`prune_lowest` of a large input: the radix select, the mask built block by block from the keys."""
    dtype = flat.dtype
    threshold, keys = _search([flat], k, dtype, largest=largest, magnitude=magnitude)
    mark = Marker(threshold, keys.workspace)
    if (
        out is not None
        and out.shape == default_mask.shape
        and out.dtype == default_mask.dtype
        and out.is_contiguous()
        and out.device == default_mask.device
    ):
        mask = out
    else:
        mask = torch.empty_like(default_mask, memory_format=torch.contiguous_format)
    outs = mask.view(-1).split(BLOCK)
    defaults = default_mask.to(device=flat.device).reshape(-1).split(BLOCK)
    for block, out_block, default in zip(keys([flat]), outs, defaults):
        keep = mark(block, out=keys.workspace.like("selected", block, torch.bool)).logical_not_()
        out_block.copy_(keep)
        if all_ones:
            continue
        if out_block.dtype == torch.bool:
            out_block.logical_and_(default)
        else:
            out_block.mul_(default)
    for number, positions in mark.finish():
        outs[number].index_fill_(0, positions.to(outs[number].device), 0)
    return mask


class _Keys:
    """The keys of flat score tensors, a block at a time, computed again on every call into reused memory.

    Each call walks the same list of tensors; what an earlier pass learnt of a
    block is kept by its place in that walk (tensor position, block number).
    """

    def __init__(self, dtype: torch.dtype, magnitude: bool) -> None:
        self.dtype = dtype
        self.magnitude = magnitude
        self.workspace = Workspace()
        self.clean: dict[tuple[int, int], bool] = {}  # (tensor position, block) -> found clean by an earlier pass

    def __call__(self, flat: Sequence[torch.Tensor]) -> Iterator[torch.Tensor]:
        for position, tensor in enumerate(flat):
            for number, block in enumerate(tensor.split(BLOCK)):
                place = (position, number)
                converted = self.workspace.converted(block, self.dtype)
                keys, self.clean[place] = flat_order_keys(
                    converted, self.magnitude, self.workspace, clean=self.clean.get(place, False)
                )
                yield keys


def _search(
    flat: list[torch.Tensor],
    k: int,
    dtype: torch.dtype,
    *,
    largest: bool,
    magnitude: bool,
    collectives: Collectives | None = None,
) -> tuple[Threshold, _Keys]:
    keys = _Keys(dtype, magnitude)
    threshold = find_threshold(
        lambda: keys(flat),
        k,
        width=key_width(dtype),
        largest=largest,
        two_pass=True,
        device=flat[0].device,
        workspace=keys.workspace,
        **({} if collectives is None else _spread(collectives)),
    )
    return threshold, keys


def _spread(collectives: Collectives) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    return {"all_reduce": collectives.all_reduce, "exclusive_prefix": collectives.exclusive_prefix}


def top_indices(
    scores: torch.Tensor, k: int, *, largest: bool = False, nonnegative: bool = False, overwrite: bool = False
) -> torch.Tensor:
    """Flat indices of the ``k`` smallest (or largest) entries of ``scores``, NaN the smallest.

    Order of the indices is unspecified. ``nonnegative``: every number in
    ``scores`` is >= 0 (norms, magnitudes), which ranks NaN lowest in one pass
    without first looking for it (:func:`nan_lowest`). ``overwrite``: ``scores``
    is a temporary of the caller's (norms just computed), which that pass may
    write in place instead of a new tensor.
    """
    flat = scores.detach() if scores.requires_grad else scores  # no autograd record of the reshape or topk
    if flat.dim() != 1:
        flat = flat.reshape(-1)
    if flat.numel() <= _SMALLEST_CUTOFF or flat.is_meta or uses_topk(flat.numel(), flat.device, flat.dtype):
        return _topk_indices(flat, k, largest, magnitude=False, nonnegative=nonnegative, overwrite=overwrite)
    return select_k([flat], k, largest=largest)[0].nonzero().squeeze(1)


def clear_selected(default_mask: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """A new contiguous mask: ``default_mask`` with 0 also where the bool ``selected`` is True.

    Same values as ``mask = default_mask.clone(); mask[selected] = 0``, built with
    dense passes instead of the much slower masked fill: the last step of most
    methods once they know what to prune (e.g. ``~keep_highest_per_row(...)``).
    """
    mask = torch.empty_like(default_mask, memory_format=torch.contiguous_format)
    if default_mask.is_meta:
        return mask
    selected = selected.reshape(mask.shape)
    if default_mask.dtype == torch.bool:
        return torch.logical_and(default_mask, selected.logical_not(), out=mask)
    if not _finite(default_mask):  # 0 * inf or 0 * NaN is not 0: the slow, exact way
        return mask.copy_(default_mask).masked_fill_(selected, 0)
    return mask.copy_(selected.logical_not()).mul_(default_mask)


def _min_max(mask: torch.Tensor) -> tuple[float, float]:
    """The smallest and largest entry of a mask (0, 0 when there is nothing to look at)."""
    if mask.is_meta or mask.numel() == 0:
        return 0.0, 0.0
    if mask.dtype == torch.bool:
        return float(mask.all()), float(mask.any())
    low, high = torch.aminmax(mask)
    return float(low), float(high)


def _finite(mask: torch.Tensor) -> bool:
    """Whether every entry of ``mask`` is finite (then ``0 * entry == 0``)."""
    return all(map(math.isfinite, _min_max(mask)))


def _select_by_topk(
    chunks: Sequence[torch.Tensor], flat: list[torch.Tensor], k: int, largest: bool
) -> list[torch.Tensor]:
    device = flat[0].device
    scores = flat[0] if len(flat) == 1 else torch.cat([f.to(device) for f in flat])
    selected = torch.zeros(scores.shape, dtype=torch.bool, device=device)
    selected.index_fill_(0, _topk_indices(scores, k, largest, magnitude=False), True)
    if len(flat) == 1:
        return [selected.view(chunks[0].shape)]
    pieces = torch.split(selected, [f.numel() for f in flat])
    return [p.view(c.shape).to(c.device) for p, c in zip(pieces, chunks)]


def _topk_indices(
    flat: torch.Tensor, k: int, largest: bool, magnitude: bool, nonnegative: bool = False, overwrite: bool = False
) -> torch.Tensor:
    """Flat indices, in no order, of the ``k`` lowest (highest) entries of 1-D ``flat`` (of ``|flat|``), NaN lowest.

    The entries ``torch.topk`` chooses, ties included: ``sorted=False`` only
    skips ordering them (on CPU a full sort of the k chosen, most of topk's
    time on a small layer), not which ones are chosen. ``nonnegative``: every
    number in ``flat`` is >= 0 (as ``|flat|`` always is). ``overwrite``: ``flat``
    may be written in place.
    """
    if flat.requires_grad:  # no autograd record of abs, sum or topk: a mask has no gradient
        flat = flat.detach()
    scores = flat.abs() if magnitude else flat
    ranks = nan_lowest(scores, nonnegative=magnitude or nonnegative, overwrite=magnitude or overwrite)
    return torch.topk(ranks, k, largest=largest, sorted=False).indices


def nan_lowest(scores: torch.Tensor, *, nonnegative: bool = False, overwrite: bool = False) -> torch.Tensor:
    """``scores`` ranked by prunereg's one NaN rule: NaN below every number, ``-inf`` included.

    Without NaN (and on ``meta``) the scores themselves; with NaN their integer
    :func:`~prunereg._selection.radix.order_keys` (the radix engine's order), of
    the same shape. Sorting, ``topk`` or ``kthvalue`` on the result ranks every
    number as on the scores and every NaN lowest (all NaN equal), so selecting
    the lowest prunes NaN first and keeping the highest keeps NaN last. Every
    selection path (``select_k``, ``prune_lowest``, ``top_indices``, the per-row
    and N:M helpers) ranks through this function or the radix engine.

    ``nonnegative``: every number in ``scores`` is >= 0 (norms, magnitudes).
    NaN then becomes -1, below all of them, in one pass: no search for NaN
    first (a reduction and a read back, most of the ranking's cost on a small layer);
    with ``overwrite`` (``scores`` is a temporary of the caller's) in place, without
    a new tensor.
    """
    if scores.is_meta or not scores.is_floating_point():
        return scores
    if nonnegative:
        if overwrite:
            return scores.nan_to_num_(-1.0, math.inf, -math.inf)
        return torch.nan_to_num(scores, nan=-1.0, posinf=math.inf, neginf=-math.inf)
    if not _holds_nan(scores):
        return scores
    return order_keys(scores).view(scores.shape)


def removal_order(scores: torch.Tensor) -> torch.Tensor:
    """The indices of 1-D ``scores`` (one per unit) in the order units are removed: prunereg's rule for removal.

    The lowest score goes first and NaN below every number (:func:`nan_lowest`,
    the rule masks follow); of equal scores the later unit goes first, so
    keeping the ``k`` highest keeps the earlier of a tie. :func:`prunereg.slim`
    and :func:`prunereg.shrink` both choose what to remove through this one order.
    """
    ranks = nan_lowest(scores.detach().to(device="cpu", dtype=torch.float64))
    return torch.sort(ranks, descending=True, stable=True).indices.flip(0)


def _holds_nan(scores: torch.Tensor) -> bool:
    """Whether floating ``scores`` holds a NaN.

    A sum is NaN whenever an entry is, and is a single pass without a bool
    temporary (``isnan().any()`` costs several times as much on a small layer);
    only a NaN sum (also from ``inf - inf``) is checked entry by entry.
    """
    total = (scores.detach() if scores.requires_grad else scores).sum()
    return math.isnan(float(total)) and bool(scores.isnan().any())


def keep_highest_per_row(scores: torch.Tensor, alive: torch.Tensor, counts: int | torch.Tensor) -> torch.Tensor:
    """Mark, in every row along the last dim, the ``counts`` entries to keep.

    Entries still ``alive`` (bool, the shape of ``scores``) rank before pruned
    ones, so keeping ``q`` entries of a row keeps as many survivors as it can;
    among those, higher scores rank first, NaN lowest, and equal scores keep
    the lower index. ``counts`` is an int or a tensor of ``scores.shape[:-1]``.
    NaN ranks below every number (:func:`nan_lowest`), so NaN entries are kept
    last: pruned first, as everywhere in prunereg. Row-wise methods (N:M groups,
    per-output-row pruning) share this ranking.
    """
    by_score = torch.sort(nan_lowest(scores), dim=-1, descending=True, stable=True).indices
    alive_sorted = alive.gather(-1, by_score).to(torch.uint8)
    order = by_score.gather(-1, torch.sort(alive_sorted, dim=-1, descending=True, stable=True).indices)
    if isinstance(counts, torch.Tensor):
        counts = counts.unsqueeze(-1)
    rank = torch.arange(scores.shape[-1], device=scores.device)
    keep_sorted = (rank < counts).expand(order.shape)
    return torch.zeros(order.shape, dtype=torch.bool, device=scores.device).scatter_(-1, order, keep_sorted)
