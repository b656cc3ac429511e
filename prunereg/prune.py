"""A drop-in for ``torch.nn.utils.prune``: ``import prunereg.prune as prune``.

Every public name of torch's module is here with the same signature and the
same masks; the classes are the very objects ``prunereg.get`` returns. See
docs/migrating.md for the few places where prunereg deliberately does better.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from prunereg._core.custom import CustomFromMask
from prunereg._core.global_pruning import global_unstructured
from prunereg._core.method import BasePruningMethod, PruningContainer
from prunereg._core.reparam import is_pruned
from prunereg._core.tied import remove
from prunereg._distributed.channels import channel_norms as _compute_norm

# torch's private helpers, which torch's own tests (and some user code) call.
from prunereg._selection.amount import nparams_to_prune as _compute_nparams_toprune
from prunereg._selection.amount import validate_amount as _validate_pruning_amount
from prunereg._selection.amount import validate_amount_init as _validate_pruning_amount_init
from prunereg._selection.amount import validate_dim as _validate_pruning_dim
from prunereg._selection.amount import validate_structured as _validate_structured_pruning
from prunereg_builtins.structured import LnStructured, RandomStructured
from prunereg_builtins.unstructured import Identity, L1Unstructured, RandomUnstructured

__all__ = [
    "BasePruningMethod",
    "CustomFromMask",
    "Identity",
    "L1Unstructured",
    "LnStructured",
    "PruningContainer",
    "RandomStructured",
    "RandomUnstructured",
    "custom_from_mask",
    "global_unstructured",
    "identity",
    "is_pruned",
    "l1_unstructured",
    "ln_structured",
    "random_structured",
    "random_unstructured",
    "remove",
]


def identity(module: nn.Module, name: str) -> nn.Module:
    """Reparametrize ``module.<name>`` without pruning any entry."""
    Identity.apply(module, name)
    return module


def random_unstructured(module: nn.Module, name: str, amount: numbers.Real) -> nn.Module:
    """Prune ``amount`` entries of ``module.<name>`` chosen uniformly at random."""
    RandomUnstructured.apply(module, name, amount)
    return module


def l1_unstructured(
    module: nn.Module, name: str, amount: numbers.Real, importance_scores: torch.Tensor | None = None
) -> nn.Module:
    """Prune the ``amount`` entries of ``module.<name>`` of smallest absolute value (or score)."""
    L1Unstructured.apply(module, name, amount=amount, importance_scores=importance_scores)
    return module


def random_structured(module: nn.Module, name: str, amount: numbers.Real, dim: int) -> nn.Module:
    """Prune ``amount`` channels of ``module.<name>`` along ``dim`` chosen at random."""
    RandomStructured.apply(module, name, amount, dim)
    return module


def ln_structured(
    module: nn.Module,
    name: str,
    amount: numbers.Real,
    n: int | float | str,
    dim: int,
    importance_scores: torch.Tensor | None = None,
) -> nn.Module:
    """Prune the ``amount`` channels of ``module.<name>`` along ``dim`` of lowest ``n``-norm."""
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def custom_from_mask(module: nn.Module, name: str, mask: torch.Tensor) -> nn.Module:
    """Prune ``module.<name>`` where ``mask`` is zero (any device or dtype)."""
    CustomFromMask.apply(module, name, mask)
    return module
