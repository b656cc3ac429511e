"""The one mask of each parameter a gradual pruning holds: installed once, then overwritten in place.

Re-pruning with ``torch.nn.utils.prune``'s API stacks one more method into a
``PruningContainer`` at every step and swaps the hook and the mask buffer. Here
each parameter is reparametrized once (``<name>_orig``, ``<name>_mask`` and a
``CustomFromMask`` hook that names the method in summaries, or the hook it already
had); every later step writes its new mask into that same buffer. The hook, the
buffer and the parameter stay the same objects, so optimizers, state dicts and
``torch.compile``'s graphs see no change but the values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from prunereg._core import reparam
from prunereg._core import tied as _tied
from prunereg._core.custom import CustomFromMask
from prunereg._distributed.counts import pruned_entries
from prunereg._distributed.layout import to_layout_of
from prunereg._files.selection import parameters_to_prune

if TYPE_CHECKING:
    from prunereg._core.method import BasePruningMethod


@dataclass(frozen=True)
class Target:
    """One parameter pruned on schedule: ``root.<name>``, held by every site listed (a tied parameter by several)."""

    label: str  # its name in logs and errors: the qualified name from the model, or its place in the list given
    root: nn.Module
    name: str
    sites: tuple[_tied.Site, ...]

    @property
    def module(self) -> nn.Module:
        return self.sites[0].module

    @property
    def attribute(self) -> str:
        return self.sites[0].name

    def orig(self) -> torch.Tensor:
        """The parameter itself (``<name>_orig``)."""
        return self._installed(self.module._parameters, "_orig")

    def mask(self) -> torch.Tensor:
        """The ``<name>_mask`` buffer every site of the parameter reads."""
        return self._installed(self.module._buffers, "_mask")

    def is_pruned(self) -> bool:
        """Whether the reparametrization is still in place (nobody made it permanent or removed it)."""
        return self.module._parameters.get(self.attribute + "_orig") is not None

    def tensors(self) -> list[tuple[nn.Module, str]]:
        return _tied.tensors(list(self.sites))

    def pruned(self) -> int:
        """How many of the parameter's entries its mask zeroes."""
        return pruned_entries(self.mask())

    def sparsity(self) -> float:
        """The share of the parameter's entries its mask zeroes."""
        return self.pruned() / self.mask().numel()

    def _installed(self, slot: Mapping[str, torch.Tensor | None], suffix: str) -> torch.Tensor:
        tensor = slot.get(self.attribute + suffix)
        if tensor is None:
            raise RuntimeError(
                f"{self.label} is no longer pruned (its {self.attribute}{suffix} is gone): it was made permanent or "
                "removed outside this GradualPruning, which cannot prune it any more"
            )
        return tensor


def targets(model: nn.Module | Iterable[tuple[nn.Module, str]], parameters: object = None) -> list[Target]:
    """The parameters to prune: ``parameters`` (``(module, name)`` pairs) or, from a model, its defaults.

    A model's defaults are :func:`prunereg.parameters_to_prune`'s. A parameter
    listed twice, or under two of its tied names, is one target.
    """
    if isinstance(model, nn.Module):
        pairs = parameters_to_prune(model) if parameters is None else _pairs(parameters)
        paths = {id(module): path for path, module in model.named_modules()}
        labels = [_label(paths, module, name) for module, name in pairs]
    else:
        if parameters is not None:
            raise TypeError("give the parameters either as the first argument or as parameters=, not both")
        pairs = _pairs(model)
        labels = [f"{index}.{name}" for index, (_, name) in enumerate(pairs)]
    if not pairs:
        raise ValueError("nothing to prune: no parameter selected (give parameters=[(module, 'weight'), ...])")
    found: list[Target] = []
    seen: set[int] = set()
    for label, (root, name) in zip(labels, pairs):
        sites = _tied.sites(root, name)
        first = sites[0]
        held = first.module._parameters.get(first.name + "_orig" if first.hooks else first.name)
        if held is None:
            raise TypeError(f"{label} is not a parameter of {type(first.module).__name__}: it cannot be pruned")
        if held.is_meta:
            raise ValueError(
                f"{label} is on the meta device, which holds no values to rank: materialize the model "
                "(to_empty, then load its weights) before GradualPruning"
            )
        if id(held) not in seen:
            seen.add(id(held))
            found.append(Target(label, root, name, tuple(sites)))
    return found


def _pairs(parameters: object) -> list[tuple[nn.Module, str]]:
    if isinstance(parameters, (str, bytes)) or not isinstance(parameters, Iterable):
        raise TypeError(f"parameters must be (module, name) pairs, not {type(parameters).__name__}")
    pairs = list(parameters)
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], nn.Module)):
            raise TypeError(f"parameters must be (module, name) pairs, got {pair!r}")
        if not isinstance(pair[1], str):
            raise TypeError(f"a parameter's name must be a string, got {type(pair[1]).__name__}")
    return pairs


def _label(paths: dict[int, str], module: nn.Module, name: str) -> str:
    path = paths.get(id(module))
    if path is None:
        raise ValueError(f"{type(module).__name__}.{name} is not in the model given: list the model's own parameters")
    return f"{path}.{name}" if path else name


def install(found: Sequence[Target], method: type[BasePruningMethod] | type) -> list[Target]:
    """Reparametrize every target that is not pruned yet with an all-ones mask; keep the masks of the others.

    The new hooks are ``CustomFromMask`` hooks whose mask is the buffer itself
    (no second copy) and which name ``method`` as the one that chose it. Call
    inside an ``all_or_nothing`` block over the targets' tensors. Returns the
    targets with their sites looked up again (their hooks changed).
    """
    installed = []
    for target in found:
        if not target.sites[0].hooks:
            CustomFromMask.apply(
                target.root, target.name, mask=torch.ones_like(getattr(target.module, target.attribute))
            )
        sites = tuple(_tied.sites(target.root, target.name))
        for site in sites:
            if not site.hooks:
                raise ValueError(f"{site.qualified} shares its parameter with {target.label} but is not pruned with it")
            for _, hook in site.hooks:
                if isinstance(hook, CustomFromMask):
                    hook.mask = site.module.get_buffer(site.name + "_mask")
                    if hook.chosen_by is None:
                        hook.chosen_by = method  # summaries name it
        installed.append(Target(target.label, target.root, target.name, sites))
    return installed


def write(target: Target, mask: torch.Tensor) -> None:
    """Make ``mask`` the target's mask, in place, and bring every site's pruned tensor up to date."""
    buffer = target.mask()
    with torch.no_grad():
        buffer.copy_(to_layout_of(mask, buffer))
    for site in target.sites:
        for _, hook in reparam.pruning_hooks(site.module, site.name):
            reparam.set_pruned_tensor(hook, site.module)
