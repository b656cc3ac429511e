"""What crosses the network when DTensors are pruned: counts summed over shards, and per-channel statistics."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from prunereg._distributed.layout import sharded_mesh_dims

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor, Shard


def sum_over_shards(counts: torch.Tensor, like: DTensor) -> torch.Tensor:
    """``counts`` summed over the ranks holding distinct shards of ``like`` (replicas counted once)."""
    import torch.distributed as dist

    for mesh_dim in sharded_mesh_dims(like):
        dist.all_reduce(counts, group=like.device_mesh.get_group(mesh_dim))
    return counts


def exclusive_prefix(counts: torch.Tensor, like: DTensor) -> torch.Tensor:
    """Sum of ``counts`` over the shards of ``like`` before this rank's (mesh coordinates in row-major order)."""
    import torch.distributed as dist

    mesh = like.device_mesh
    before = torch.zeros_like(counts)
    block = counts.clone()  # the total of the sub-mesh below the current dim
    for mesh_dim in reversed(sharded_mesh_dims(like)):
        group = mesh.get_group(mesh_dim)
        gathered = [torch.empty_like(block) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, block, group=group)
        position = mesh.get_local_rank(mesh_dim)
        before += sum(gathered[:position], torch.zeros_like(block))
        block = sum(gathered, torch.zeros_like(block))
    return before


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
