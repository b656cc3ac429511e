"""What the core needs of a DTensor: tell one, lay a tensor out like another, write into a sharded parameter.

Everything here is local: no collective runs, and ``torch.distributed`` is
imported only when a tensor is a DTensor.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeGuard, cast

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


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
    return to_shards_of(tensor, reference)


def to_shards_of(tensor: torch.Tensor, reference: DTensor) -> DTensor:
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


def copy_whole(param: torch.Tensor, whole: torch.Tensor) -> None:
    """Copy the plain tensor ``whole`` into ``param`` in place; a sharded ``param`` takes its own shards of it.

    Local: every rank must hold the same ``whole``.
    """
    with torch.no_grad():
        if is_dtensor(param):
            param.to_local().copy_(to_shards_of(whole, param).to_local())
        else:
            param.copy_(whole)


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


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``t``, a DTensor that a method or a selection returned as a plain ``Tensor``."""
    return cast("DTensor", t).to_local()


def wrap(local: torch.Tensor, like: DTensor, shape: list[int] | None = None) -> DTensor:
    """This rank's ``local`` shard of a DTensor laid out like ``like`` (of another ``shape`` if given)."""
    from torch.distributed.tensor import DTensor

    size = like.shape if shape is None else torch.Size(shape)
    stride = like.stride() if shape is None else torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False, shape=size, stride=stride)


def sharded_mesh_dims(t: DTensor) -> list[int]:
    """The mesh dims over which ``t`` is split (the others replicate it)."""
    return [mesh_dim for mesh_dim, placement in enumerate(t.placements) if placement.is_shard()]


def same_sharding(chunks: Sequence[torch.Tensor]) -> list[DTensor]:
    """``chunks``, DTensors all split over the same mesh dims (else counts of several tensors would not add up)."""
    first = chunks[0]
    if not is_dtensor(first):
        raise TypeError("cannot combine a DTensor with a plain tensor")
    mesh, dims = first.device_mesh, sharded_mesh_dims(first)
    checked = [first]
    for chunk in chunks[1:]:
        if not is_dtensor(chunk) or chunk.device_mesh != mesh:
            raise ValueError("pruning several tensors together needs them all sharded on one device mesh")
        if sharded_mesh_dims(chunk) != dims:
            raise NotImplementedError(
                "pruning several DTensors together needs them sharded over the same mesh dims: "
                f"got {first.placements} and {chunk.placements}"
            )
        checked.append(chunk)
    return checked
