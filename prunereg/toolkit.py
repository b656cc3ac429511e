"""Building blocks for pruning-method authors, with a stable API.

Plugins import these instead of prunereg's private modules: torch's rules for
``amount``, prunereg's sort-free selection (exactly ``k`` entries, NaN first,
deterministic ties) and the all-or-nothing guard that keeps a module intact
when pruning several tensors fails half-way.
"""

from __future__ import annotations

import numbers
import torch

from prunereg._amount import nparams_to_prune, validate_amount, validate_amount_init
from prunereg._reparam import all_or_nothing
from prunereg._select import clear_selected, keep_highest_per_row, prune_k, select_k

__all__ = [
    "all_or_nothing",
    "check_amount",
    "count_to_prune",
    "keep_highest_per_row",
    "prune_lowest",
    "prune_where",
    "select_k",
]


def check_amount(amount: object) -> None:
    """Validate a method's ``amount`` as torch does when the method is built.

    A non-number is a ``TypeError``; a negative int or a float outside [0, 1] a ``ValueError``.
    """
    validate_amount_init(amount)


def count_to_prune(amount: numbers.Real, units: int) -> int:
    """How many of ``units`` entries (or channels) ``amount`` prunes, by torch's rules.

    An int is absolute and may not exceed ``units`` (``ValueError``); a float is a
    fraction, rounded half to even as Python's ``round`` does.
    """
    count = nparams_to_prune(amount, units)
    validate_amount(count, units)
    return count


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
    ``k`` entries, NaN pruned first, ties broken by position, no sort on large
    tensors, works on every device including ``meta``. ``out``, a contiguous
    tensor of ``default_mask``'s shape and dtype (``scores`` itself, say, when
    they are scratch), may receive the mask instead of new memory.
    """
    if k == 0:
        return default_mask.clone(memory_format=torch.contiguous_format)
    return prune_k(scores, k, default_mask, largest=largest, magnitude=magnitude, out=out)


def prune_where(default_mask: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """A new mask: ``default_mask`` with zeros also where the bool ``selected`` is True.

    The last step of most methods, once they know what to prune (for example
    ``~keep_highest_per_row(...)``); faster than a masked fill on large tensors.
    """
    return clear_selected(default_mask, selected)
