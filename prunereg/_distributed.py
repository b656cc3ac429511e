"""The sharded layer: the one place that tells a DTensor (DTensor, FSDP2) from a plain tensor.

Every public function here takes plain tensors or DTensors. Plain ones go to the
single-process code (:mod:`prunereg._select`, :mod:`prunereg._channels`,
:mod:`prunereg._remaining`, :mod:`prunereg._amount`); DTensors are pruned shard
by shard, with the masks of the full tensors. What crosses the network is
small: element counts, one norm per channel, shard sizes; weights never do, so
memory per rank stays proportional to its shard. Random draws are made by every
rank from the same generator stream over the full tensor, keeping only its own
part, so masks agree across ranks and do not depend on their number.

Pruning methods never ask which kind of tensor they hold: they call these
functions (through :mod:`prunereg.toolkit`). ``torch.distributed`` is imported
only when a tensor is a DTensor.
"""

from __future__ import annotations

import math
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeGuard, TypeVar, cast

import torch

from prunereg import _amount, _channels, _remaining, _select

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor, Shard

    from prunereg._remaining import MaskMethod

# Random draws are generated in blocks of at most this many entries (64 MiB of
# fp32): enough that a 4096 x 4096 layer is one block, so on CUDA its draws are
# those of torch.rand_like on the full tensor; on CPU the generator is a stream
# and block boundaries never change the draws.
DRAW_BLOCK = 1 << 24


def is_dtensor(t: object) -> TypeGuard[DTensor]:
    """Whether ``t`` is a DTensor; never imports torch.distributed (a DTensor means it is loaded)."""
    tensor_module = sys.modules.get("torch.distributed.tensor")
    return tensor_module is not None and isinstance(t, tensor_module.DTensor)


def to_layout_of(tensor: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``tensor`` where ``reference`` lives: on its device, and sharded like it if it is a DTensor.

    A full (plain) tensor is cut into the reference's shards locally, without
    communication; a DTensor with other placements is redistributed.
    """
    if not is_dtensor(reference):
        if is_dtensor(tensor):
            raise TypeError(
                "cannot combine a DTensor with a plain tensor: got a sharded tensor "
                f"for a plain one of shape {tuple(reference.shape)}"
            )
        return tensor.to(device=reference.device)
    return _to_shards_of(tensor, reference)


def _to_shards_of(tensor: torch.Tensor, reference: DTensor) -> DTensor:
    """:func:`to_layout_of` a DTensor ``reference``."""
    from torch.distributed.tensor import distribute_tensor

    if is_dtensor(tensor):
        if tensor.device_mesh != reference.device_mesh:
            raise ValueError(f"tensor is on device mesh {tensor.device_mesh}, expected {reference.device_mesh}")
        if tuple(tensor.placements) == tuple(reference.placements):
            return tensor
        return tensor.redistribute(reference.device_mesh, reference.placements)
    return distribute_tensor(
        tensor.detach().to(device=reference.device),
        reference.device_mesh,
        reference.placements,
        src_data_rank=None,
    )


def assign_values(param: torch.Tensor, value: torch.Tensor) -> None:
    """Make ``value`` the values of ``param``, keeping the Parameter object and its memory format.

    A sharded ``param`` receives them in its own storage: FSDP2 keeps its own
    view of that storage, so ``param.data = ...`` would be lost at the next all-gather.
    """
    if is_dtensor(param):
        with torch.no_grad():
            param.to_local().copy_(value.to_local())  # type: ignore[attr-defined]  # value is a DTensor too
        return
    if value.stride() != param.stride():
        value = torch.empty_like(param).copy_(value)
    param.data = value


def refuse_gathered_parameter(module: torch.nn.Module, name: str) -> None:
    """Explain the forward of a module whose sharded pruned parameter FSDP2 gathered under its old name.

    FSDP2 tracks a parameter by the name it had when ``fully_shard`` was called
    and gathers it back there before every forward, next to ``<name>_orig``.
    """
    if is_dtensor(module._parameters.get(name + "_orig")):
        raise RuntimeError(
            f"{type(module).__name__}.{name} was pruned after fully_shard, and FSDP2 gathers it "
            f"under its old name: call prunereg.remove(module, {name!r}) before the forward "
            "to make the pruning permanent, or prune before fully_shard (see docs/distributed.md)"
        )


# --- selecting the k smallest entries (unstructured and global pruning) --------


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
        return _select.select_k(chunks, k, largest=largest, magnitude=magnitude)
    return _sharded_select_k(chunks, k, largest=largest, magnitude=magnitude)


def _sharded_select_k(
    plain_or_sharded: Sequence[torch.Tensor], k: int, *, largest: bool, magnitude: bool
) -> list[torch.Tensor]:
    chunks = _same_sharding(plain_or_sharded)
    like = chunks[0]
    collectives = _select.Collectives(
        total=sum(chunk.numel() for chunk in chunks),
        all_reduce=lambda counts: sum_over_shards(counts, like),
        exclusive_prefix=lambda ties: _exclusive_prefix(ties, like),
    )
    local = _select.select_spread(
        [chunk.to_local() for chunk in chunks], k, collectives, largest=largest, magnitude=magnitude
    )
    return [_wrap(flags, chunk) for flags, chunk in zip(local, chunks)]


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
        return _select.prune_lowest(scores, k, default_mask, largest=largest, magnitude=magnitude, out=out)
    (selected,) = _sharded_select_k([scores], k, largest=largest, magnitude=magnitude)
    mask = _to_shards_of(default_mask, scores)
    return _wrap(_select.clear_selected(mask.to_local(), local_shard(selected)), scores)


def _same_sharding(chunks: Sequence[torch.Tensor]) -> list[DTensor]:
    """``chunks``, DTensors all split over the same mesh dims (else counts of several tensors would not add up)."""
    first = chunks[0]
    if not is_dtensor(first):
        raise TypeError("cannot combine a DTensor with a plain tensor")
    mesh, dims = first.device_mesh, _sharded_mesh_dims(first)
    checked = [first]
    for chunk in chunks[1:]:
        if not is_dtensor(chunk) or chunk.device_mesh != mesh:
            raise ValueError("pruning several tensors together needs them all sharded on one device mesh")
        if _sharded_mesh_dims(chunk) != dims:
            raise NotImplementedError(
                "pruning several DTensors together needs them sharded over the same mesh dims: "
                f"got {first.placements} and {chunk.placements}"
            )
        checked.append(chunk)
    return checked


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``t``, a DTensor that a method or a selection returned as a plain ``Tensor``."""
    return cast("DTensor", t).to_local()


def _sharded_mesh_dims(t: DTensor) -> list[int]:
    return [mesh_dim for mesh_dim, placement in enumerate(t.placements) if placement.is_shard()]


def sum_over_shards(counts: torch.Tensor, like: DTensor) -> torch.Tensor:
    """``counts`` summed over the ranks holding distinct shards of ``like`` (replicas counted once)."""
    import torch.distributed as dist

    for mesh_dim in _sharded_mesh_dims(like):
        dist.all_reduce(counts, group=like.device_mesh.get_group(mesh_dim))
    return counts


def _exclusive_prefix(counts: torch.Tensor, like: DTensor) -> torch.Tensor:
    """Sum of ``counts`` over the shards of ``like`` before this rank's (mesh coordinates in row-major order)."""
    import torch.distributed as dist

    mesh = like.device_mesh
    before = torch.zeros_like(counts)
    block = counts.clone()  # the total of the sub-mesh below the current dim
    for mesh_dim in reversed(_sharded_mesh_dims(like)):
        group = mesh.get_group(mesh_dim)
        gathered = [torch.empty_like(block) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, block, group=group)
        position = mesh.get_local_rank(mesh_dim)
        before += sum(gathered[:position], torch.zeros_like(block))
        block = sum(gathered, torch.zeros_like(block))
    return before


# --- random draws -----------------------------------------------------------


def rand_like(t: torch.Tensor) -> torch.Tensor:
    """``torch.rand_like(t)``, contiguous; for a DTensor each rank keeps its part of the full tensor's draws.

    Every rank draws the whole tensor's stream from its default generator (the
    same seed gives the same stream), in blocks whose boundaries depend on the
    shape only; so the draws do not depend on the number of ranks, and on CPU
    they are exactly ``torch.rand_like`` of the full tensor.
    """
    if not is_dtensor(t):
        return torch.rand_like(t, memory_format=torch.contiguous_format)
    return _sharded_rand_like(t)


def _sharded_rand_like(t: DTensor) -> DTensor:
    sources = _DRAW_SOURCES.get(id(t))
    if sources is None:
        local = _box_draws(t, t.dtype)
    else:
        # A vector of what earlier pruning left: the draws of each source at its
        # kept entries (flat flags over its local shard; None: all of them).
        draws = [_box_draws(source, t.dtype).reshape(-1) for source, _ in sources]
        local = torch.cat([d if keep is None else d[keep] for d, (_, keep) in zip(draws, sources)])
    return _wrap(local, t)


def _box_draws(t: DTensor, dtype: torch.dtype) -> torch.Tensor:
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _reject_strided(t)
    local_shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    out = torch.empty(local_shape, dtype=dtype, device=t.device)
    box = [(start, start + size) for start, size in zip(offset, local_shape)]
    _draw_block(out, tuple(t.shape), box, dtype, t.device)
    return out


def _draw_block(
    out: torch.Tensor | None,
    shape: tuple[int, ...],
    box: list[tuple[int, int]],
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Draw a block of ``shape`` from the stream and copy its ``box`` into ``out`` (None: discard).

    The calls to the generator depend on ``shape`` alone, never on ``box``.
    """
    numel = math.prod(shape)
    if numel == 0:
        return
    inner = math.prod(shape[1:])
    if numel <= DRAW_BLOCK:
        block = torch.rand(shape, dtype=dtype, device=device)
        if out is not None:
            out.copy_(block[tuple(slice(lo, hi) for lo, hi in box)])
        return
    (first_lo, first_hi), inner_box = box[0], box[1:]
    if inner <= DRAW_BLOCK:
        rows = DRAW_BLOCK // inner
        inner_slices = tuple(slice(lo, hi) for lo, hi in inner_box)
        for start in range(0, shape[0], rows):
            stop = min(start + rows, shape[0])
            block = torch.rand((stop - start, *shape[1:]), dtype=dtype, device=device)
            lo, hi = max(start, first_lo), min(stop, first_hi)
            if out is not None and lo < hi:
                out[lo - first_lo : hi - first_lo].copy_(block[tuple([slice(lo - start, hi - start), *inner_slices])])
        return
    for row in range(shape[0]):
        part = out[row - first_lo] if out is not None and first_lo <= row < first_hi else None
        _draw_block(part, shape[1:], inner_box, dtype, device)


def _reject_strided(t: DTensor) -> None:
    for placement in t.placements:
        if placement.is_shard() and type(placement).__name__ != "Shard":
            raise NotImplementedError(
                f"prunereg cannot prune a DTensor with placement {placement} (only Shard and Replicate)"
            )


# --- channels (structured pruning) --------------------------------------------


def channel_norms(t: torch.Tensor, n: int | float | str, dim: int) -> torch.Tensor:
    """The ``n``-norm of every slice of ``t`` along ``dim``; for a DTensor, the same full vector on every rank.

    Each rank reduces its shard to partial statistics per channel (sum of
    ``|x|^p``, count of non-zeros, max or min of ``|x|``); these are combined
    across the ranks that split a channel, and gathered along ``dim``.
    """
    if not is_dtensor(t):
        return _amount.compute_norm(t, n, dim)
    return _sharded_channel_norms(t, n, dim)


def _sharded_channel_norms(t: DTensor, n: int | float | str, dim: int) -> torch.Tensor:
    # torch's own checks of n and dim, on a tensor without data.
    _amount.compute_norm(torch.empty(t.shape, dtype=t.dtype, device="meta"), n, dim)
    dim = dim % t.dim()
    if n == "fro":
        n = 2
    if not isinstance(n, (int, float)):
        raise NotImplementedError(f"ln_structured on a DTensor supports numeric n and 'fro', not {n!r}")
    local = t.to_local()
    others = [d for d in range(t.dim()) if d != dim]
    if n == math.inf:
        stats, op = _amax(local.abs(), others), "max"
    elif n == -math.inf:
        stats, op = -_amax(-local.abs(), others), "min"
    elif n == 0:
        stats, op = (local != 0).sum(dim=others, dtype=torch.float64), "sum"
    else:
        stats, op = local.abs().to(torch.float64).pow(n).sum(dim=others), "sum"
    norms = gather_channels(t, dim, stats, op)
    if n not in (0, math.inf, -math.inf):
        norms = norms.pow(1.0 / n)
    return norms


def _amax(values: torch.Tensor, dims: list[int]) -> torch.Tensor:
    if values.numel() == 0:  # an empty shard holds no channel or adds nothing to one
        shape = [s for d, s in enumerate(values.shape) if d not in dims]
        return torch.full(shape, -math.inf, dtype=torch.float64, device=values.device)
    return values.amax(dim=dims).to(torch.float64)


def gather_channels(t: DTensor, dim: int, stats: torch.Tensor, op: str) -> torch.Tensor:
    """Per-channel ``stats`` of the local shard, combined with ``op`` over the shards of each channel.

    Returns the full vector (one entry per channel of ``t`` along ``dim``) on every rank.
    """
    import torch.distributed as dist

    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
    mesh = t.device_mesh
    stats = stats.contiguous()
    for mesh_dim, placement in enumerate(t.placements):
        if placement.is_shard() and cast("Shard", placement).dim != dim:
            dist.all_reduce(stats, op=reduce_op, group=mesh.get_group(mesh_dim))
    span = ChannelSpan.of(t, dim)
    if span.mesh_dim is None:
        return stats
    padded = torch.zeros(max(span.sizes), dtype=stats.dtype, device=stats.device)
    padded[: stats.numel()] = stats
    pieces = [torch.empty_like(padded) for _ in span.sizes]
    dist.all_gather(pieces, padded, group=mesh.get_group(span.mesh_dim))
    return torch.cat([piece[:size] for piece, size in zip(pieces, span.sizes)])


class ChannelSpan:
    """Which channels along ``dim`` this rank's shard holds: ``offset`` and ``count``.

    Found by gathering the shard sizes along ``dim``, so it also holds for
    shards of uneven or compacted size.
    """

    def __init__(self, mesh_dim: int | None, sizes: list[int], coordinate: int) -> None:
        self.mesh_dim = mesh_dim
        self.sizes = sizes
        self.offset = sum(sizes[:coordinate])
        self.count = sizes[coordinate]

    @classmethod
    def of(cls, t: DTensor, dim: int) -> ChannelSpan:
        import torch.distributed as dist

        dim = dim % t.dim()
        mesh_dims = [i for i, p in enumerate(t.placements) if p.is_shard() and cast("Shard", p).dim == dim]
        if any(type(t.placements[i]).__name__ != "Shard" for i in mesh_dims):
            raise NotImplementedError(
                f"prunereg cannot prune channels along dim {dim} with placements {t.placements} "
                "(only Shard and Replicate)"
            )
        local_size = t.to_local().shape[dim]
        if not mesh_dims:
            return cls(None, [local_size], 0)
        if len(mesh_dims) > 1:
            raise NotImplementedError(
                f"prunereg cannot prune channels along dim {dim}, sharded over several mesh dimensions ({t.placements})"
            )
        (mesh_dim,) = mesh_dims
        group = t.device_mesh.get_group(mesh_dim)
        size = torch.tensor([local_size], dtype=torch.int64, device=t.to_local().device)
        sizes = [torch.empty_like(size) for _ in range(dist.get_world_size(group))]
        dist.all_gather(sizes, size, group=group)
        return cls(mesh_dim, [int(s) for s in sizes], t.device_mesh.get_local_rank(mesh_dim))


def channel_mask(t: torch.Tensor, keep: torch.Tensor, dim: int, default_mask: torch.Tensor) -> torch.Tensor:
    """``default_mask`` times the mask of ``t`` keeping the channels ``keep`` along ``dim``, in ``t``'s dtype.

    ``keep`` holds indices or flags, the same on every rank.
    """
    if not is_dtensor(t):
        return _channels.channel_mask(t, keep, dim, default_mask)
    return _sharded_channel_mask(t, keep, dim, default_mask)


def _sharded_channel_mask(t: DTensor, keep: torch.Tensor, dim: int, default_mask: torch.Tensor) -> DTensor:
    flags = torch.zeros(t.shape[dim], dtype=torch.bool, device=keep.device)
    flags[keep] = True
    span = ChannelSpan.of(t, dim)
    local_keep = flags[span.offset : span.offset + span.count]
    shape = [1] * t.dim()
    shape[dim] = span.count
    local = torch.zeros_like(t.to_local())
    local += local_keep.reshape(shape).to(device=local.device, dtype=local.dtype)
    local *= local_shard(default_mask).to(dtype=local.dtype)
    return _wrap(local, t)


# --- what earlier pruning left (PruningContainer) --------------------------------


def combine_masks(method: MaskMethod, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """:func:`prunereg._remaining.combine_masks` of a plain tensor or a DTensor.

    For a DTensor, the entries (or channels) still kept are compacted on each
    rank into a DTensor of their own; ``method`` computes its mask on it, and
    the result is written back in place of those entries.
    """
    if not is_dtensor(t):
        return _remaining.combine_masks(method, t, mask)
    return _sharded_combine_masks(method, t, mask)


def _sharded_combine_masks(method: MaskMethod, t: DTensor, plain_or_sharded_mask: torch.Tensor) -> torch.Tensor:
    kind = method.PRUNING_TYPE
    mask = _to_shards_of(plain_or_sharded_mask, t)
    if kind == "global":
        return method.compute_mask(t, default_mask=mask).to(dtype=t.dtype)
    local_t, local_mask = t.to_local(), mask.to_local()
    new_local = local_mask.to(dtype=t.dtype, copy=True)
    if kind == "unstructured":
        remaining = local_mask == 1
        spread = SpreadVector(t, [t])
        partial = method.compute_mask(
            spread(local_t[remaining], [remaining.reshape(-1)]), default_mask=spread(local_mask[remaining])
        )
        new_local[remaining] = local_shard(partial).to(dtype=t.dtype)
    elif kind == "structured":
        dim = _remaining.structured_dim(method, t.dim())
        used = gather_channels(t, dim, (local_mask != 0).sum(dim=[d for d in range(t.dim()) if d != dim]), "sum")
        span = ChannelSpan.of(t, dim)
        index = used[span.offset : span.offset + span.count].nonzero().reshape(-1).to(local_t.device)
        shape = list(t.shape)
        shape[dim] = int(used.count_nonzero())
        partial = method.compute_mask(
            _wrap(local_t.index_select(dim, index), t, shape),
            default_mask=_wrap(local_mask.index_select(dim, index), t, shape),
        )
        new_local.index_copy_(dim, index, local_shard(partial).to(dtype=t.dtype))
    else:
        raise ValueError(f"Unrecognized PRUNING_TYPE {kind}")
    return _wrap(new_local, t)


class Entry(NamedTuple):
    """One tensor of a global pruning: the tensor, the scores ranking its entries, its current mask (None: unpruned)."""

    tensor: torch.Tensor
    scores: torch.Tensor
    old_mask: torch.Tensor | None


_Method = TypeVar("_Method", bound="MaskMethod")


def global_shares(
    method: _Method,
    entries: list[Entry],
    *,
    plain: Callable[[_Method, list[Entry]], list[torch.Tensor]],
    concatenated: Callable[[_Method, list[Entry], SpreadVector], list[torch.Tensor]],
) -> list[torch.Tensor]:
    """Each tensor's share of ``method``'s mask over all ``entries`` pruned together, as one vector.

    Plain tensors are left to ``plain(method, entries)``. For DTensors, as in one
    process, ``method`` sees the entries that earlier pruning left in all tensors
    as one vector: ``concatenated(method, local_entries, spread)`` builds it from
    this rank's shards, as a vector spread over the ranks (a
    :class:`SpreadVector`); plain scores and masks are cut into the tensors' shards first.
    """
    if not is_dtensor(entries[0].tensor):
        return plain(method, entries)
    tensors = _same_sharding([entry.tensor for entry in entries])
    scores = [_to_shards_of(entry.scores, t) for entry, t in zip(entries, tensors)]
    local_entries = [
        Entry(
            t.to_local(),
            s.to_local(),
            None if entry.old_mask is None else _to_shards_of(entry.old_mask, t).to_local(),
        )
        for entry, t, s in zip(entries, tensors, scores)
    ]
    shares = concatenated(method, local_entries, SpreadVector(tensors[0], scores))
    return [_wrap(share, t) for share, t in zip(shares, tensors)]


# The vectors of kept entries that SpreadVector built, by id, with their
# sources and kept entries: a method computes its mask on such a vector, and
# rand_like of it must give the draws of the sources' full streams at those
# entries, as in one process. An entry lives as long as its vector.
_DRAW_SOURCES: dict[int, list[tuple[DTensor, torch.Tensor | None]]] = {}


class SpreadVector:
    """Turns each rank's part of a vector into one 1-D DTensor spread over the ranks.

    Its length is the sum over the ranks holding distinct shards of ``like``
    (replicas count once). Given the kept entries of each of ``sources`` (flat
    flags over their local shards), the vector draws random numbers at those
    entries of the sources' full streams (:func:`rand_like`).
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


def _wrap(local: torch.Tensor, like: DTensor, shape: list[int] | None = None) -> DTensor:
    """This rank's ``local`` shard of a DTensor laid out like ``like`` (of another ``shape`` if given)."""
    from torch.distributed.tensor import DTensor

    size = like.shape if shape is None else torch.Size(shape)
    stride = like.stride() if shape is None else torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False, shape=size, stride=stride)
