"""A sharded (FSDP2 or DTensor) model run as plain tensors one module at a time: gathered whole, written back after.

A block-by-block run on a model sharded with FSDP2 gathers the parameters of
one block (:func:`gather`: one ``all_gather`` per parameter, in the same order
on every rank), works on that block as plain tensors, then writes the
block's values back into each rank's own shards (:meth:`Gathered.release`:
every rank holds the same values, so each cuts its own shard, without
communication) and drops the gathered copy. While it runs, FSDP2's forward
hooks are set aside (:func:`fsdp_hooks_set_aside`), so that no forward a rank
makes on its own share of the data starts a collective.
"""

from __future__ import annotations

import contextlib
import sys
from collections import OrderedDict
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import nn

from prunereg._distributed.layout import copy_whole, is_dtensor

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

#: What to do instead, for a model prunereg cannot gather block by block.
_INSTEAD = "shard with fully_shard on a 1-D mesh of every rank, or prune the model before sharding it"


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` holds a DTensor parameter (FSDP2, tensor parallelism) or an FSDP2 module.

    (After a forward an FSDP2 module may hold its parameters gathered, as plain
    tensors: writing into those would be lost at its next reshard.)
    """
    return any(is_dtensor(parameter) for parameter in model.parameters()) or any(map(_is_fsdp, model.modules()))


def _is_fsdp(module: nn.Module) -> bool:
    """Whether ``module`` is an FSDP2 module (``fully_shard`` was called on it); never imports torch.distributed."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(module, fsdp.FSDPModule)


def plain_class(module: nn.Module) -> type[nn.Module]:
    """``module``'s class as it was before ``fully_shard`` (which gives it a class of its own, ``FSDP<name>``)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None:
        return type(module)
    return next(kind for kind in type(module).__mro__ if not issubclass(kind, fsdp.FSDPModule))


def reshard(model: nn.Module) -> None:
    """Put every FSDP2 module of ``model`` back in its shards (local: FSDP2 drops the gathered copy, if any)."""
    for module in model.modules():
        if _is_fsdp(module):
            module.reshard()  # type: ignore[operator]  # an FSDPModule's


def check_gatherable(model: nn.Module, what: str) -> None:
    """Refuse, in one line, a sharded ``model`` that :func:`gather` cannot run block by block; nothing changes.

    Every FSDP2 module is :func:`reshard`-ed first. Then every DTensor
    parameter must be split (``Shard``) or replicated over one 1-D mesh of all
    the ranks of the default process group (FSDP2's standard recipe), and each
    FSDP2 module sharded by a ``fully_shard`` call of its own. ``what`` names
    the caller in the message.
    """
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate, Shard

    reshard(model)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    for name in _outside_fsdp(model):
        raise NotImplementedError(
            f"{what}: {name} is a DTensor outside any fully_shard module (tensor parallelism, say), whose forward "
            f"hooks prunereg cannot run on whole tensors; {_INSTEAD}"
        )
    for name, parameter in model.named_parameters():
        if not is_dtensor(parameter):
            continue
        mesh = parameter.device_mesh
        if mesh.ndim != 1 or mesh.mesh.flatten().tolist() != list(range(world)):
            raise NotImplementedError(
                f"{what}: {name} is sharded over the device mesh {mesh.mesh.tolist()}, and a sharded model is "
                f"calibrated only on a 1-D mesh of every rank ({world}); {_INSTEAD}"
            )
        for placement in parameter.placements:
            if not (type(placement) is Shard or isinstance(placement, Replicate)):
                raise NotImplementedError(
                    f"{what}: {name} has the placement {placement}, and a sharded model is calibrated only with "
                    f"Shard or Replicate; {_INSTEAD}"
                )
    for name, module in model.named_modules():
        if _forward_hook_ids(module) is None:
            raise NotImplementedError(
                f"{what}: {name or type(module).__name__} was sharded by one fully_shard call with other "
                f"modules, which prunereg cannot run one block at a time; call fully_shard on each module alone"
            )


def _outside_fsdp(model: nn.Module) -> Iterator[str]:
    """The names of ``model``'s DTensor parameters that no FSDP2 module (it or one around it) holds."""

    def walk(module: nn.Module, prefix: str, inside: bool) -> Iterator[str]:
        inside = inside or _is_fsdp(module)
        for name, parameter in module._parameters.items():
            if is_dtensor(parameter) and not inside:
                yield prefix + name
        for name, child in module._modules.items():
            if child is not None:
                yield from walk(child, f"{prefix}{name}.", inside)

    return walk(model, "", False)


@contextlib.contextmanager
def fsdp_hooks_set_aside(model: nn.Module) -> Iterator[None]:
    """FSDP2's forward hooks on ``model``'s modules set aside, every FSDP2 module :func:`reshard`-ed first; back after.

    Without them a forward is a plain one, no collective, on whatever the
    modules hold: :func:`gather` makes that the whole parameters.
    """
    reshard(model)
    set_aside = []
    for module in model.modules():
        ids = _forward_hook_ids(module)
        if not ids:
            continue
        set_aside.append((module, module._forward_pre_hooks, module._forward_hooks))
        module._forward_pre_hooks = OrderedDict((k, h) for k, h in module._forward_pre_hooks.items() if k not in ids)
        module._forward_hooks = OrderedDict((k, h) for k, h in module._forward_hooks.items() if k not in ids)
    try:
        yield
    finally:
        for module, pre_hooks, hooks in set_aside:
            module._forward_pre_hooks, module._forward_hooks = pre_hooks, hooks


def _forward_hook_ids(module: nn.Module) -> set[int] | None:
    """The ids of FSDP2's forward hooks on ``module`` (empty if it is no FSDP2 module; None if they have none)."""
    if not _is_fsdp(module):
        return set()
    state = module._get_fsdp_state()  # type: ignore[operator]  # an FSDPModule's
    ids = [
        getattr(getattr(state, name, None), "id", None)
        for name in ("_pre_forward_hook_handle", "_post_forward_hook_handle")
    ]
    if not all(isinstance(id_, int) for id_ in ids):
        return None  # a group of modules sharded together: one handle for hooks spread over all of them
    return {id_ for id_ in ids if isinstance(id_, int)}


@dataclass
class Gathered:
    """The parameters :func:`gather` replaced by whole plain ones: ``(module, name, sharded, whole)`` each."""

    swapped: list[tuple[nn.Module, str, DTensor, nn.Parameter]] = field(default_factory=list)

    def release(self, *, write_back: bool) -> None:
        """Put the sharded parameters back; with ``write_back``, each rank's shards take the whole ones' values first.

        Local (no collective): every rank holds the same whole values and cuts
        its own shards out of them. The whole copies are dropped. A module that
        no longer holds the whole parameter (a failed run put its parameters
        back as they were, and the values into the shards) is left as it is.
        """
        written: set[int] = set()
        for module, name, sharded, whole in self.swapped:
            if module._parameters.get(name) is not whole:
                continue
            if write_back and id(sharded) not in written:
                copy_whole(sharded, whole.detach())
                written.add(id(sharded))
            module._parameters[name] = sharded  # type: ignore[assignment]  # a DTensor Parameter
        self.swapped.clear()


def gather(root: nn.Module, *, skip: Collection[nn.Module] = ()) -> Gathered:
    """Replace every DTensor parameter of ``root``'s modules (less those inside ``skip``) by a whole plain one.

    A collective: one ``all_gather`` per distinct parameter, in ``root``'s
    module order, which every rank must make in the same order. A parameter
    several modules share (tied embeddings) becomes one whole parameter.
    """
    skipped = {id(module) for outer in skip for module in outer.modules()}
    gathered = Gathered()
    wholes: dict[int, nn.Parameter] = {}
    for module in root.modules():
        if id(module) in skipped:
            continue
        for name, parameter in list(module._parameters.items()):
            if not is_dtensor(parameter):
                continue
            whole = wholes.get(id(parameter))
            if whole is None:
                whole = nn.Parameter(parameter.full_tensor().detach(), requires_grad=parameter.requires_grad)
                wholes[id(parameter)] = whole
            gathered.swapped.append((module, name, parameter, whole))
            module._parameters[name] = whole
    return gathered
