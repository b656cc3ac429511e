"""The masks of a mask method (``unstructured``, ``structured``) at a scheduled sparsity, exactly.

The schedule's share becomes a count by torch's rounding rule, per parameter
(entries, or channels along the method's ``dim``) or, with ``globally``, over
all parameters as one. A monotone method (every method unless its class sets
``MONOTONE = False``) is given the count still missing as an integer
``amount`` and acts only on what the mask still keeps, as in a
``PruningContainer``: what was pruned stays pruned and the count is exact. A
method that lets weights grow back chooses the whole count afresh from the
original values each time. Every mask is checked to hold exactly that count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from prunereg._core.global_pruning import global_masks
from prunereg._core.method import BasePruningMethod
from prunereg._distributed.counts import pruned_channels, pruned_entries
from prunereg._distributed.remaining import combine_masks
from prunereg._gradual.masks import Target
from prunereg._selection.amount import count_for, validate_structured
from prunereg._selection.remaining import structured_dim
from prunereg._text import describe

KINDS = ("unstructured", "structured")


class MaskMethodPlan:
    """How ``method(amount=..., **options)`` prunes the targets at a level, per parameter or ``globally``."""

    def __init__(
        self, method: type[BasePruningMethod], name: str, options: dict[str, Any], *, globally: bool, monotone: bool
    ) -> None:
        if method.PRUNING_TYPE not in KINDS:
            raise TypeError(
                f"method {name!r} is {method.PRUNING_TYPE!r}: gradual pruning takes an unstructured or structured "
                "method with an amount (globally=True prunes all parameters as one)"
            )
        if globally and method.PRUNING_TYPE != "unstructured":
            raise TypeError(f"globally=True needs an unstructured method, and {name!r} is {method.PRUNING_TYPE!r}")
        self.method = method
        self.name = name
        self.options = options
        self.globally = globally
        self.monotone = monotone

    def build(self, amount: int) -> BasePruningMethod:
        """The method pruning ``amount`` more units; an error naming it if it cannot be built with an amount."""
        try:
            return self.method(amount=amount, **self.options)  # type: ignore[call-arg]  # methods with an amount
        except TypeError as error:
            raise TypeError(f"method {self.name!r} cannot be given amount={amount}: {error}") from error

    def masks(self, found: Sequence[Target], level: float) -> list[torch.Tensor]:
        """Each target's mask at ``level``, checked to prune exactly the count the level asks."""
        if self.globally:
            return self._global(found, level)
        return [self._one(target, level) for target in found]

    def _one(self, target: Target, level: float) -> torch.Tensor:
        try:
            return self._exactly(target, level)
        except (IndexError, ValueError) as error:  # the method's own refusal, named where it happened
            raise type(error)(f"{self.name!r} on {target.label}: {describe(error)}") from error

    def _exactly(self, target: Target, level: float) -> torch.Tensor:
        orig, mask = target.orig().detach(), target.mask().detach()
        probe = self.build(0)
        dim = None
        if probe.PRUNING_TYPE == "structured":
            validate_structured(orig)  # torch's error: a vector has no channels to count
            dim = structured_dim(probe, orig.dim())
        units = orig.numel() if dim is None else orig.shape[dim]
        wanted = count_for(level, units)
        if self.monotone:
            done = _pruned(mask, dim)
            if done > wanted:
                raise ValueError(
                    f"{target.label} has {done} of {units} {_unit(dim)} pruned already, more than the {wanted} that "
                    f"sparsity {level:g} asks: a monotone method never restores them"
                )
            default = mask.to(orig.dtype) if mask.dtype == torch.bool else mask
            new = combine_masks(self.build(wanted - done), orig * default, default)
        else:
            new = self.build(wanted).compute_mask(orig, default_mask=torch.ones_like(orig))
        _check_count(new, dim, wanted, f"{self.name!r} on {target.label}", units)
        return new

    def _global(self, found: Sequence[Target], level: float) -> list[torch.Tensor]:
        tensors = [target.orig().detach() for target in found]
        masks = [target.mask().detach() for target in found]
        total = sum(t.numel() for t in tensors)
        wanted = count_for(level, total)
        if self.monotone:
            done = sum(_pruned(mask, None) for mask in masks)
            if done > wanted:
                raise ValueError(
                    f"{done} of the {total} weights are pruned already, more than the {wanted} that sparsity "
                    f"{level:g} asks: a monotone method never restores them"
                )
            new = global_masks(self.build(wanted - done), tensors, tensors, masks)
        else:
            new = global_masks(self.build(wanted), tensors, tensors, [None] * len(tensors))
        pruned = sum(_pruned(mask, None) for mask in new)
        if pruned != wanted:
            raise RuntimeError(f"{self.name!r} pruned {pruned} of {total} weights globally, where {wanted} were asked")
        return new


def _pruned(mask: torch.Tensor, dim: int | None) -> int:
    return pruned_entries(mask) if dim is None else pruned_channels(mask, dim)


def _unit(dim: int | None) -> str:
    return "entries" if dim is None else f"channels along dim {dim}"


def _check_count(mask: torch.Tensor, dim: int | None, wanted: int, what: str, units: int) -> None:
    pruned = _pruned(mask, dim)
    if pruned != wanted:
        raise RuntimeError(
            f"{what} pruned {pruned} of {units} {_unit(dim)} where {wanted} were asked: "
            "the method does not prune the integer amount it is given"
        )
