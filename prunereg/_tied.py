"""Tensors named from an ancestor module, and parameters that several modules share.

torch prunes ``module.<name>`` where it lives and knows nothing of other
modules holding the same Parameter (an LM head tied to the input embedding):
the head is pruned, the embedding is not, and they silently diverge.

prunereg also accepts a dotted name relative to any ancestor,
``prune.l1_unstructured(model, "lm_head.weight", amount=0.3)``. Before
anything changes, every other attribute under that ancestor holding the same
Parameter is found with ``named_parameters(remove_duplicate=False)``; all of
them are then pruned with one mask, each module with its own hook, so every
use of the parameter sees the same pruned values. The hooks remember the
group, and pruning one member alone afterwards (which would split it) is
refused with an error naming the others.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, NamedTuple

from prunereg import _attention, _reparam

if TYPE_CHECKING:
    import torch
    from torch import nn


class Site(NamedTuple):
    """One place a parameter is held: ``module.<name>``, known under ``qualified`` from the ancestor."""

    qualified: str
    module: nn.Module
    name: str


def resolve(root: nn.Module, name: str) -> Site:
    """The module holding ``root.<name>`` (``name`` may be dotted) and the attribute's own name."""
    path, _, attribute = name.rpartition(".")
    return Site(name, root.get_submodule(path) if path else root, attribute)


def sites(root: nn.Module, name: str) -> list[Site]:
    """Every attribute under ``root`` holding the parameter ``root.<name>``, the named one first.

    A pruned member holds the parameter as ``<attr>_orig``; it is listed under
    its unpruned name, as the pruning functions take it.
    """
    named = resolve(root, name)
    parameter = _held_parameter(named.module, named.name)
    if parameter is None:
        return [named]
    found = [named]
    for qualified, candidate in root.named_parameters(remove_duplicate=False):
        if candidate is not parameter:
            continue
        site = resolve(root, qualified)
        if _reparam.pruning_hooks(site.module, site.name.removesuffix("_orig")):
            site = Site(qualified.removesuffix("_orig"), site.module, site.name.removesuffix("_orig"))
        if (site.module, site.name) != (named.module, named.name):
            found.append(site)
    return found


def _held_parameter(module: nn.Module, name: str) -> torch.nn.Parameter | None:
    if _reparam.pruning_hooks(module, name):
        return module._parameters.get(name + "_orig")
    return module._parameters.get(name)


def tensors(group: list[Site]) -> list[tuple[nn.Module, str]]:
    """The ``(module, name)`` pairs of ``group``, as :func:`prunereg._reparam.all_or_nothing` takes them."""
    return [(site.module, site.name) for site in group]


def share(group: list[Site]) -> None:
    """Give every other member of ``group`` the first member's mask and a copy of its hook, and remember the group.

    Each module gets its own hook object, so each keeps its own record of the
    tensor it computed; they hold the same Parameter and the same mask tensor.
    """
    first, others = group[0], group[1:]
    if not others:
        return
    hook = _reparam.pruning_hooks(first.module, first.name)[0][1]
    mask = first.module.get_buffer(first.name + "_mask")
    for site in others:
        copied = copy.copy(hook)
        for record in ("_refs", "_stamp", "_param_order"):
            copied.__dict__.pop(record, None)
        copied._tensor_name = site.name
        _reparam.install(site.module, site.name, copied, mask)
    names = tuple(site.qualified for site in group)
    for site in group:
        for _, member_hook in _reparam.pruning_hooks(site.module, site.name):
            member_hook._shared_with = names
            member_hook._shared_as = site.qualified


def remove(root: nn.Module, name: str) -> nn.Module:
    """Make the pruning of ``root.<name>`` permanent everywhere its parameter is used under ``root``."""
    group = sites(root, name)
    pruned = [site for site in group if _reparam.pruning_hooks(site.module, site.name)] or group[:1]
    with _reparam.all_or_nothing([(site.module, site.name) for site in pruned]):
        for site in pruned:
            _reparam.remove(site.module, site.name)
    _attention.forget_refreshes(root, group[0].qualified)
    return root


def refuse_splitting(site: Site) -> None:
    """Refuse to prune one member of a group pruned together: the others would keep the old mask."""
    for _, hook in _reparam.pruning_hooks(site.module, site.name):
        others = [name for name in getattr(hook, "_shared_with", ()) if name != hook._shared_as]
        if others:
            raise ValueError(
                f"{hook._shared_as} shares its parameter with {', '.join(others)}: prune them together "
                f"from a module holding all of them, e.g. prune.l1_unstructured(model, {hook._shared_as!r}, ...)"
            )
