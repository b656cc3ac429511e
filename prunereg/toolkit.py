"""Building blocks for pruning-method authors, with a stable API.

Plugins import these instead of prunereg's private modules: torch's rules for
``amount``, prunereg's sort-free selection (exactly ``k`` entries, NaN first,
deterministic ties) and the all-or-nothing guard that keeps a module intact
when pruning several tensors fails half-way.
"""

from __future__ import annotations

import numbers

from prunereg._amount import nparams_to_prune, validate_amount, validate_amount_init
from prunereg._reparam import all_or_nothing
from prunereg._select import clear_selected as prune_where
from prunereg._select import keep_highest_per_row, prune_lowest, select_k

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

