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

Naming the tensor from a module that does not hold every user of it
(``prune.l1_unstructured(model.lm_head, "weight", ...)``) would leave the
others with the unpruned Parameter, so it is refused, before anything changes,
with an error naming them (:func:`refuse_holders_outside`).
"""

from __future__ import annotations

import copy
import functools
import gc
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

from prunereg._core import attention, reparam


class Site(NamedTuple):
    """One place a parameter is held: ``module.<name>``, known under ``qualified`` from the ancestor.

    ``hooks`` are the pruning hooks acting on it when the site was found
    (:func:`prunereg._core.reparam.pruning_hooks`): looked up once, then
    carried with the site through one pruning call instead of looked up
    again at every step. Installing a hook makes them stale.
    """

    qualified: str
    module: nn.Module
    name: str
    hooks: tuple[tuple[int, reparam.PruningHook], ...] = ()


def resolve(root: nn.Module, name: str) -> Site:
    """The module holding ``root.<name>`` (``name`` may be dotted), the attribute's own name and its hooks."""
    path, _, attribute = name.rpartition(".")
    module = root.get_submodule(path) if path else root
    return Site(name, module, attribute, tuple(reparam.pruning_hooks(module, attribute)))


def sites(root: nn.Module, name: str) -> list[Site]:
    """Every attribute under ``root`` holding the parameter ``root.<name>``, the named one first.

    A pruned member holds the parameter as ``<attr>_orig``; it is listed under
    its unpruned name, as the pruning functions take it.
    """
    named = resolve(root, name)
    parameter = named.module._parameters.get(named.name + "_orig" if named.hooks else named.name)
    if parameter is None:
        return [named]
    found = [named]
    if not root._modules:
        # A module without submodules holds its parameters itself: no need for named_parameters' walk,
        # and mostly the named one alone (the loop over a model's layers).
        held_by_root = 0
        for candidate in root._parameters.values():  # a loop: a generator's frame costs more here
            if candidate is parameter:
                held_by_root += 1
        if held_by_root == 1:
            return found
        held: Iterable[tuple[str, nn.Parameter | None]] = root._parameters.items()
    else:
        held = root.named_parameters(remove_duplicate=False)
    for qualified, candidate in held:
        if candidate is not parameter:
            continue
        path, _, attribute = qualified.rpartition(".")
        module = root.get_submodule(path) if path else root
        if module is named.module and attribute in (named.name, named.name + "_orig"):
            continue  # the named site itself, found already
        found.append(_held_at(qualified, module, attribute))
    return found


def _held_at(qualified: str, module: nn.Module, attribute: str) -> Site:
    """The site of the parameter ``module._parameters[attribute]``: ``<name>_orig`` of a pruned one is ``<name>``."""
    if attribute.endswith("_orig"):
        base = attribute.removesuffix("_orig")
        hooks = tuple(reparam.pruning_hooks(module, base))
        if hooks:
            return Site(qualified.removesuffix("_orig"), module, base, hooks)
    return Site(qualified, module, attribute, tuple(reparam.pruning_hooks(module, attribute)))


def tensors(group: list[Site]) -> list[tuple[nn.Module, str]]:
    """The ``(module, name)`` pairs of ``group``, as :func:`prunereg._core.reparam.all_or_nothing` takes them."""
    return [(site.module, site.name) for site in group]


def share(group: list[Site], hook: reparam.PruningHook) -> None:
    """Give every other member of ``group`` the first member's mask and a copy of ``hook``, and remember the group.

    ``hook`` is the one just installed on the first member. Each module gets
    its own hook object, so each keeps its own record of the tensor it
    computed; they hold the same Parameter and the same mask tensor.
    """
    first, others = group[0], group[1:]
    if not others:
        return
    mask = first.module.get_buffer(first.name + "_mask")
    members = [(first, hook)]
    for site in others:
        copied = copy.copy(hook)
        for record in ("_refs", "_stamp", "_param_order"):
            copied.__dict__.pop(record, None)
        copied._tensor_name = site.name
        reparam.install(site.module, site.name, copied, mask, list(site.hooks))
        members.append((site, copied))
    names = tuple(site.qualified for site in group)
    for site, member_hook in members:
        member_hook._shared_with = names
        member_hook._shared_as = site.qualified


def remove(module: nn.Module, name: str) -> nn.Module:
    """Make the pruning of ``module.<name>`` permanent everywhere its parameter is used under ``module``.

    torch's signature, parameter names included (``remove(module=m, name="weight")``);
    ``name`` may be dotted, relative to any ancestor, as in the pruning functions.
    """
    group = sites(module, name)
    pruned = [site for site in group if site.hooks] or group[:1]
    with reparam.all_or_nothing([(site.module, site.name) for site in pruned]):
        for site in pruned:
            reparam.remove(site.module, site.name, list(site.hooks))
    attention.forget_refreshes(module, group[0].qualified)
    return module


def make_pruning_permanent(model: nn.Module) -> nn.Module:
    """Make every pruning under ``model`` permanent: :func:`remove` for each pruned tensor (Lightning's name).

    Tied parameters are removed once for all their holders; hooks that
    ``torch.nn.utils.prune`` installed are removed too. On an error nothing is
    removed. Returns ``model``; a model without pruning is left as it is.
    """
    pruned = [
        (f"{path}.{hook._tensor_name}" if path else hook._tensor_name, submodule, hook._tensor_name)
        for path, submodule in model.named_modules()
        for hook in list(submodule._forward_pre_hooks.values())
        if isinstance(hook, torch_prune.BasePruningMethod)
    ]
    with reparam.all_or_nothing([(submodule, name) for _, submodule, name in pruned]):
        for qualified, submodule, name in pruned:
            if reparam.pruning_hooks(submodule, name):  # not already removed with a tied member
                remove(model, qualified)
    return model


def refuse_splitting(site: Site) -> None:
    """Refuse to prune one member of a group pruned together: the others would keep the old mask."""
    for _, hook in site.hooks:
        others = [name for name in getattr(hook, "_shared_with", ()) if name != hook._shared_as]
        if others:
            raise ValueError(
                f"{hook._shared_as} shares its parameter with {', '.join(others)}: prune them together "
                f"from a module holding all of them, e.g. prune.l1_unstructured(model, {hook._shared_as!r}, ...)"
            )


def refuse_holders_outside(targets: Sequence[tuple[nn.Module, list[Site]]]) -> None:
    """Refuse to prune a parameter that a module outside the one given also holds, before anything changes.

    ``targets`` pairs each module a pruning call was given with the group it
    prunes (:func:`sites`). Pruning there alone would leave the outside holder
    (the embedding tied to an LM head) with the unpruned Parameter. Finding
    holders means a scan of every object the garbage collector tracks (tens of
    milliseconds in a process with torch and transformers), so it runs only for
    parameters with more references than the group's modules account for, once
    for all of them; holders that are not modules (optimizers, user variables)
    are fine.
    """
    suspects = []
    for root, group in targets:  # a loop: a comprehension's own frame costs as much as the check on a small layer
        if _has_unexplained_references(group):
            suspects.append((root, group[0]))
    if not suspects:
        return
    parameters = [site.module._parameters[_key(site)] for _, site in suspects]
    referrers = gc.get_referrers(*parameters)
    snapshots = {id(held) for held in reparam.snapshot_parameters()}
    inside: dict[int, set[int]] = {}
    for (root, site), parameter in zip(suspects, parameters):
        if id(root) not in inside:
            inside[id(root)] = snapshots | {id(module._parameters) for module in root.modules()}
        foreign = [
            held
            for held in referrers
            if isinstance(held, dict)
            and id(held) not in inside[id(root)]
            and any(value is parameter for value in held.values())
        ]
        holders = _module_holders(foreign, parameter) if foreign else []
        if holders:
            raise ValueError(
                f"{type(site.module).__name__}.{site.name} shares its Parameter with {', '.join(holders)}, outside "
                f"the {type(root).__name__} given: pruning it there alone would leave them unpruned. Prune every use "
                "at once: give a module holding all of them and a dotted name (model, 'lm_head.weight' rather than "
                "model.lm_head, 'weight')"
            )


def _key(site: Site) -> str:
    """The key of ``site``'s parameter in its module's ``_parameters``."""
    return site.name + "_orig" if site.hooks else site.name


def _has_unexplained_references(group: list[Site]) -> bool:
    """Whether something besides the modules of ``group`` may hold its parameter: cheap, never wrongly False.

    Each module holding it accounts for one reference, and so does each copy
    of a ``_parameters`` that an open :func:`prunereg._core.reparam.all_or_nothing`
    holds; a live autograd graph accounts for one more. No local variable here
    may hold the parameter while it is counted.
    """
    site = group[0]
    key = _key(site)
    if site.module._parameters.get(key) is None:
        return False
    pruned = getattr(site.module, site.name, None) if key != site.name else None
    in_graph = pruned is not None and _computed_from(pruned, site.module._parameters[key])
    other_holders = len({(id(member.module), member.name) for member in group}) - 1 if len(group) > 1 else 0
    references = _references(site.module._parameters, key)
    explained = _own_references()[in_graph] + other_holders
    # Copies held by open snapshots only explain more: counted only when the rest leaves references unexplained.
    return references > explained and references > explained + _snapshot_references(site.module._parameters[key])


def _snapshot_references(parameter: torch.Tensor | None) -> int:
    """How many copies of ``_parameters`` that open ``all_or_nothing`` blocks hold reference ``parameter``."""
    return sum(value is parameter for held in reparam.snapshot_parameters() for value in held.values())


def _references(parameters: dict[str, Any], key: str) -> int:
    """The reference count of ``parameters[key]``, as seen from here (the calibration measures the same way)."""
    return sys.getrefcount(parameters[key])


def _computed_from(tensor: torch.Tensor, parameter: torch.Tensor | None) -> bool:
    """Whether autograd links ``tensor`` to ``parameter`` in one step, as a pruned tensor to its ``_orig``."""
    grad_fn = tensor.grad_fn
    return grad_fn is not None and any(
        getattr(node, "variable", None) is parameter for node, _ in grad_fn.next_functions
    )


@functools.cache
def _own_references() -> tuple[int, int]:
    """What :func:`_references` counts for a parameter only its module holds: alone, and in a live autograd graph.

    Measured on a fresh module rather than assumed: the count differs between
    CPython versions, and torch holds one more reference while autograd nodes
    keep the tensor. That one is all they add, whatever they are (hence the
    cap, in case the measurement ran under a mode that keeps tensors).
    """
    with torch.inference_mode(False), torch.enable_grad():
        fresh = nn.Module()
        fresh.weight = nn.Parameter(torch.zeros(1))  # not nn.Linear: drawing its initial values would move the seed
        alone = _references(fresh._parameters, "weight")
        derived = fresh.weight * 1
        in_graph = _references(fresh._parameters, "weight") if _computed_from(derived, fresh.weight) else alone
    return alone, min(in_graph, alone + 1)


def _module_holders(dicts: list[dict[Any, Any]], parameter: torch.Tensor | None) -> list[str]:
    """``Class.attribute`` of every module whose ``_parameters`` is one of ``dicts`` and holds ``parameter``."""
    holders = attention.modules_holding(dicts, parameter, "_parameters")
    return list(dict.fromkeys(f"{type(module).__name__}.{key}" for module, key in holders))
