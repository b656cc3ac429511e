"""The pruning-method contract: what every built-in and third-party method implements."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from torch import nn


class BasePruningMethod(ABC):
    """A way of choosing which entries of a tensor to zero out.

    Subclasses implement :meth:`compute_mask` and set ``PRUNING_TYPE`` to
    ``"unstructured"``, ``"structured"`` (and then have a ``dim`` attribute) or
    ``"global"``; that type tells a :class:`PruningContainer` which entries a
    later method may still act on. An instance applied to a module is also its
    forward pre-hook: before every forward it recomputes ``<name> = <name>_orig * <name>_mask``,
    except with autograd off when neither changed since the last time (then
    ``<name>`` already holds that product, and a no_grad forward costs what the
    unpruned model's does).
    """

    PRUNING_TYPE: ClassVar[str]
    _tensor_name: str

    def __call__(self, module: nn.Module, inputs: Any) -> None:
        # With autograd on, the product must be recomputed: it links <name> to
        # <name>_orig in this forward's graph.
        if torch.is_grad_enabled() or not _reparam.pruned_tensor_is_current(self, module):
            _reparam.set_pruned_tensor(self, module)

    @abstractmethod
    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return the mask for ``t``: ``default_mask`` with more entries set to zero."""

    def apply_mask(self, module: nn.Module) -> torch.Tensor:
        """The pruned tensor, ``<name>_orig * <name>_mask``, in the original's dtype."""
        if self._tensor_name is None:
            raise AssertionError(f"Module {module} has to be pruned")
        mask = getattr(module, self._tensor_name + "_mask")
        orig = getattr(module, self._tensor_name + "_orig")
        if mask.dtype == torch.bool:  # compact masks: autograd then keeps the bool mask, not a float copy
            return orig * mask
        return mask.to(dtype=orig.dtype) * orig

    @classmethod
    def apply(
        cls,
        module: nn.Module,
        name: str,
        *args: Any,
        importance_scores: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> BasePruningMethod:
        """Prune ``module.<name>`` with a new ``cls(*args, **kwargs)``, on top of any earlier pruning.

        Nothing changes on the module unless every step succeeds.
        """
        return _tied.prune(cls, module, name, args, kwargs, importance_scores)

    def prune(
        self,
        t: torch.Tensor,
        default_mask: torch.Tensor | None = None,
        importance_scores: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return ``t`` with this method's mask applied, leaving ``t`` untouched."""
        importance_scores = _reparam.scores_for(t, importance_scores, "tensor t")
        default_mask = default_mask if default_mask is not None else torch.ones_like(t)
        return t * self.compute_mask(importance_scores, default_mask=default_mask)

    def remove(self, module: nn.Module) -> None:
        """Make the pruning permanent: ``<name>`` becomes a plain parameter holding the pruned values."""
        if self._tensor_name is None:
            raise AssertionError(
                f"Module {module} has to be pruned before pruning can be removed"
            )
        _reparam.make_permanent(self, module)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_refs", None)
        state.pop("_stamp", None)
        return state

    def __deepcopy__(self, memo: dict[int, Any]) -> BasePruningMethod:
        # torch's methods make deepcopy of a pruned module fail (pytorch#37322).
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__dict__.update(copy.deepcopy(self.__getstate__(), memo))
        _reparam.memoize_pruned_tensor(self, copied, memo)
        return copied


# At the end: the reparametrization engine needs the class defined above.
from prunereg import _reparam, _tied  # noqa: E402
