"""The pruning-method contract: what every built-in and third-party method implements.

A method computes masks (:meth:`BasePruningMethod.compute_mask`); applied to a
module it becomes that tensor's forward pre-hook (:class:`prunereg._core.reparam.PruningHook`).
Pruning a tensor again stacks the methods in a :class:`PruningContainer`, whose
newest method acts only on what the earlier ones left.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.utils.prune as torch_prune

from prunereg._core import attention as _attention
from prunereg._core import compact as _compact
from prunereg._core import reparam
from prunereg._core import tied as _tied
from prunereg._distributed.remaining import combine_masks
from prunereg._plugins.isolation import guard_plugin_methods
from prunereg._selection.channels import ones_like

if TYPE_CHECKING:
    from torch import nn


class BasePruningMethod(reparam.PruningHook, ABC):
    """A way of choosing which entries of a tensor to zero out.

    Subclasses implement :meth:`compute_mask` and set ``PRUNING_TYPE`` to
    ``"unstructured"``, ``"structured"`` (and then have a ``dim`` attribute) or
    ``"global"``; that type tells a :class:`PruningContainer` which entries a
    later method may still act on. An instance applied to a module is also its
    forward pre-hook: before every forward it recomputes ``<name> = <name>_orig * <name>_mask``,
    except with autograd off when neither changed since the last time (then
    ``<name>`` already holds that product, and a no_grad forward costs what the
    unpruned model's does).

    An ``"unstructured"`` method with an ``amount`` may set ``RANKED_BY`` to say
    that its mask prunes the ``amount`` entries that prunereg's selection ranks
    first: ``"magnitude"``, those of smallest absolute score (as
    ``l1_unstructured``), or ``"random"``, those with the largest of
    ``torch.rand`` draws (as ``random_unstructured``). :func:`prunereg.global_unstructured`
    then prunes many tensors with it by a streamed threshold search, without
    concatenating them.
    """

    PRUNING_TYPE: ClassVar[str]
    RANKED_BY: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A third-party method runs as plugin code: sys.exit() in it is an error, its prints go to stderr.
        guard_plugin_methods(cls, ("__init__", "compute_mask"))

    @abstractmethod
    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """Return the mask for ``t``: ``default_mask`` with more entries set to zero."""

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

        ``name`` may be dotted, relative to any ancestor (``model, "lm_head.weight"``):
        every other attribute under ``module`` holding the same Parameter (a tied
        embedding) is then pruned with the same mask, and attention modules on
        the way refresh the tensor before their forward. A parameter that a
        module outside ``module`` also holds is refused (ValueError naming it).
        Nothing changes on the module unless every step succeeds.
        """
        group = _tied.sites(module, name)  # each site carries its hooks: looked up once per call
        first = group[0]
        if len(first.hooks) > 1:
            raise AssertionError(
                f"Avoid adding multiple pruning hooks to the same tensor {first.name} of "
                f"module {first.module}. Use a PruningContainer."
            )
        if len(group) == 1:
            _tied.refuse_splitting(first)
        _tied.refuse_holders_outside([(module, group)])
        method = cls(*args, **kwargs)
        # One tensor: the undo log of a first pruning where it applies (no references are counted inside).
        block = reparam.all_or_nothing_first(first.module, first.name) if len(group) == 1 else None
        with block or reparam.all_or_nothing(_tied.tensors(group)):
            hook = _prune(first.module, first.name, method, importance_scores, hooks=list(first.hooks))
            _tied.share(group, hook)
            _attention.refresh_where_read(module, first.qualified)
        return hook

    def prune(
        self,
        t: torch.Tensor,
        default_mask: torch.Tensor | None = None,
        importance_scores: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return ``t`` with this method's mask applied, leaving ``t`` untouched."""
        importance_scores = reparam.scores_for(t, importance_scores, "tensor t")
        default_mask = default_mask if default_mask is not None else torch.ones_like(t)
        return t * self.compute_mask(importance_scores, default_mask=default_mask)


@torch_prune.PruningContainer.register  # isinstance(hook, torch's PruningContainer) holds; the masks stay ours
class PruningContainer(BasePruningMethod):
    """The history of pruning methods applied to one tensor, newest last.

    Its mask is the newest method's mask computed on what the earlier ones left:
    ``"unstructured"`` methods see the entries still equal to 1, ``"structured"``
    ones the channels along their ``dim`` that are not all zero, ``"global"``
    ones the whole tensor.
    """

    def __init__(self, *args: BasePruningMethod) -> None:
        self._pruning_methods: tuple[BasePruningMethod, ...] = ()
        if args:
            # torch leaves the name unset for several methods and then fails (AttributeError).
            self._tensor_name = args[0]._tensor_name
        for method in args:
            self.add_pruning_method(method)

    def add_pruning_method(self, method: BasePruningMethod | None) -> None:
        """Append ``method``, which must act on the same tensor as the others."""
        if not isinstance(method, torch_prune.BasePruningMethod) and method is not None:
            raise TypeError(f"{type(method)} is not a BasePruningMethod subclass")
        if method is not None and self._tensor_name != method._tensor_name:
            raise ValueError(
                "Can only add pruning methods acting on the parameter named "
                f"'{self._tensor_name}' to PruningContainer {self}. "
                f"Found '{method._tensor_name}'"
            )
        self._pruning_methods += (method,)  # type: ignore[operator]

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self) -> Iterator[BasePruningMethod]:
        return iter(self._pruning_methods)

    def __getitem__(self, idx: int) -> BasePruningMethod:
        return self._pruning_methods[idx]

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        """The newest method's mask, computed on what ``default_mask`` has left."""
        return combine_masks(self._pruning_methods[-1], t, default_mask)


def install_mask(
    module: nn.Module, name: str, method: BasePruningMethod, mask: torch.Tensor, hooks: reparam.Hooks | None = None
) -> BasePruningMethod:
    """Prune ``module.<name>`` with ``method`` whose final mask is already known; the hook now acting on it.

    Global pruning computes every tensor's combined mask at once; this registers
    that mask as is, without computing it a second time or copying it.
    ``hooks``: the tensor's pruning hooks, when the caller has looked them up.
    Call it inside an ``all_or_nothing`` block over the tensor.
    """
    return _prune(module, name, method, None, mask=mask, hooks=hooks)


def _prune(
    module: nn.Module,
    name: str,
    method: BasePruningMethod,
    importance_scores: torch.Tensor | None,
    mask: torch.Tensor | None = None,
    hooks: reparam.Hooks | None = None,
) -> BasePruningMethod:
    """Prune ``module.<name>`` with ``method`` (and ``mask``, when already known), on top of any earlier pruning.

    ``hooks``: the tensor's pruning hooks (:func:`prunereg._core.reparam.pruning_hooks`), when known.
    Called inside an ``all_or_nothing`` block over the tensor, which undoes it on an error.
    """
    method._tensor_name = name
    hooks = reparam.pruning_hooks(module, name) if hooks is None else hooks
    orig = getattr(module, name)
    reparam.check_prunable(module, name, hooks, orig)
    if importance_scores is None:
        importance_scores = orig
    else:  # the message names the module: its repr costs more than the rest of a small layer's bookkeeping
        importance_scores = reparam.scores_for(orig, importance_scores, f"parameter {name} of {module}")
    if not hooks:
        if mask is None:
            mask = _checked(method.compute_mask(importance_scores, default_mask=ones_like(orig)), orig, name)
        reparam.install(module, name, method, _compact.stored(mask, orig.dtype, None), hooks)
        return method

    old = hooks[0][1]
    container = old if isinstance(old, PruningContainer) else PruningContainer(*_history(old))
    _, old_mask = reparam.orig_and_mask(module, name)
    if mask is None:
        default_mask = old_mask.detach()
        if default_mask.dtype == torch.bool:  # compact storage: methods see the usual dtype
            default_mask = default_mask.to(orig.dtype)
        mask = combine_masks(method, importance_scores, default_mask)
    mask = _compact.stored(mask, orig.dtype, old_mask)
    container.add_pruning_method(method)  # the caller's all_or_nothing block undoes it on an error
    reparam.install(module, name, container, mask, hooks)
    return container


def _history(hook: torch_prune.BasePruningMethod) -> tuple[BasePruningMethod, ...]:
    """The methods a hook has applied, oldest first; a hook torch installed may be its own container."""
    if isinstance(hook, torch_prune.PruningContainer):
        return tuple(hook)
    return (hook,)  # type: ignore[return-value]  # torch's methods are used through the same interface


def _checked(mask: torch.Tensor, orig: torch.Tensor, name: str) -> torch.Tensor:
    """``mask`` if it fits ``orig``: the same shape (a mask that only broadcasts would reshape the tensor) and device.

    RuntimeError, as torch raises when such a mask meets the tensor in ``orig * mask``.
    """
    if mask.shape != orig.shape:
        raise RuntimeError(
            f"compute_mask returned a mask of shape {list(mask.shape)} for {name!r} of shape {list(orig.shape)}"
        )
    if mask.device != orig.device:
        raise RuntimeError(f"compute_mask returned a mask on {mask.device} for {name!r} on {orig.device}")
    return mask
