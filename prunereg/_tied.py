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
from typing import TYPE_CHECKING, Any, NamedTuple

from prunereg import _attention, _container, _reparam

if TYPE_CHECKING:
    import torch
    from torch import nn

    from prunereg._method import BasePruningMethod


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


def prune(
    cls: type[BasePruningMethod],
    root: nn.Module,
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    importance_scores: torch.Tensor | None,
) -> BasePruningMethod:
    """Prune ``root.<name>`` and every other attribute under ``root`` sharing its parameter, with one mask."""
    group = sites(root, name)
    first = group[0]
    if len(group) == 1:
        refuse_splitting(first)
    with _reparam.all_or_nothing([(site.module, site.name) for site in group]):
        hook = _reparam.prune_tensor(cls, first.module, first.name, args, kwargs, importance_scores)
        newest = hook[-1] if isinstance(hook, _container.PruningContainer) else hook
        mask = first.module._buffers[first.name + "_mask"]
        for site in group[1:]:
            _reparam.install_mask(site.module, site.name, copy.copy(newest), mask)
        if len(group) > 1:
            _remember_group(group)
        _attention.refresh_where_read(root, first.qualified)
    _attention.warn_if_read_elsewhere(root, first)
    return hook


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


def _remember_group(group: list[Site]) -> None:
    names = tuple(site.qualified for site in group)
    for site in group:
        for _, hook in _reparam.pruning_hooks(site.module, site.name):
            hook._shared_with = names
            hook._shared_as = site.qualified
