"""Building blocks for pruning-method authors, with a stable API.

Plugins import these (and :mod:`prunereg`) instead of prunereg's private
modules: torch's rules for ``amount`` and ``dim``, prunereg's sort-free
selection (exactly ``k`` entries, NaN first, deterministic ties) and its per-row,
N:M and whole-matrix forms for calibrated methods, random draws,
channel norms and masks, the layout of one tensor for another, the all-or-nothing
guard that keeps a module intact when pruning several tensors fails half-way,
and the method that applies a given mask. Every function but the calibrated
helpers (``lowest_per_row``, ``lowest_n_of_m``, ``lowest_overall``,
``keep_highest_per_row``: plain tensors, as a one-shot pass holds them) takes
plain tensors and DTensors alike (sharded models are pruned shard by shard), so
a method written with them never asks which one it holds.

Methods of the block-by-block engines (``calibrated``, ``shrink``) read
statistics of calibration activations; a statistic of one's own is a
:class:`Statistic` subclass made known with :func:`register_statistic`, which
a method then names in its ``STATISTICS`` (``docs/plugins.md``, "Statistics");
the built-in ones (:class:`InputSqNorms`, :class:`Hessian`, :class:`ChannelMoments`,
:class:`BlockCosine`, :class:`ExpertRouting`) are public classes of the same kind.

For importance authors (:class:`prunereg.Importance`, what ``prunereg.slim``
ranks channels by): :class:`Group`, the units a ratio is taken of and the
tensor positions each holds, and :func:`unit_sums`, any per-entry measure
added up per unit.
"""

from __future__ import annotations

import numbers

from prunereg._core.custom import CustomFromMask
from prunereg._core.reparam import all_or_nothing
from prunereg._distributed.channels import channel_mask, channel_norms
from prunereg._distributed.draws import rand_like
from prunereg._distributed.layout import to_layout_of
from prunereg._distributed.select import prune_lowest, select_k
from prunereg._runtime.registry import register_statistic, statistic_names
from prunereg._runtime.standard import (
    BlockCosine,
    ChannelMoments,
    ExpertRouting,
    Hessian,
    InputSqNorms,
    Moments,
    Routing,
)
from prunereg._runtime.statistics import Observation, Statistic
from prunereg._selection.amount import count_for, nparams_to_prune, validate_amount, validate_amount_init
from prunereg._selection.amount import validate_dim as check_dim
from prunereg._selection.amount import validate_structured as check_structured
from prunereg._selection.scopes import lowest_n_of_m, lowest_overall, lowest_per_row
from prunereg._selection.select import clear_selected as prune_where
from prunereg._selection.select import keep_highest_per_row, top_indices
from prunereg._slim.importance import unit_sums
from prunereg._slim.units import Group

__all__ = [
    "BlockCosine",
    "ChannelMoments",
    "CustomFromMask",
    "ExpertRouting",
    "Group",
    "Hessian",
    "InputSqNorms",
    "Moments",
    "Observation",
    "Routing",
    "Statistic",
    "all_or_nothing",
    "channel_mask",
    "channel_norms",
    "check_amount",
    "check_dim",
    "check_structured",
    "count_for",
    "count_to_prune",
    "keep_highest_per_row",
    "lowest_n_of_m",
    "lowest_overall",
    "lowest_per_row",
    "prune_lowest",
    "prune_where",
    "rand_like",
    "register_statistic",
    "select_k",
    "statistic_names",
    "to_layout_of",
    "top_indices",
    "unit_sums",
]


def check_amount(amount: object) -> None:
    """Validate a method's ``amount`` as torch does when the method is built.

    A non-number is a ``TypeError``; a negative int or a float outside [0, 1] a ``ValueError``.
    """
    validate_amount_init(amount)


def count_to_prune(amount: numbers.Real, units: int) -> int:
    """How many of ``units`` entries (or channels) ``amount`` prunes, by torch's rules.

    An int is absolute and may not exceed ``units`` (``ValueError``); a float is a
    fraction, rounded by :func:`count_for` (half to even, as Python's ``round``).
    """
    count = nparams_to_prune(amount, units)
    validate_amount(count, units)
    return count
