"""The reparametrization: ``<name>_orig`` parameter, ``<name>_mask`` buffer, forward pre-hook.

Pruning ``module.<name>`` moves the Parameter object itself to ``<name>_orig``
(so optimizers keep working), stores the mask as the buffer ``<name>_mask`` and
sets ``module.<name> = orig * mask`` now and before every forward. Every change
to a module here is all-or-nothing: on any error the module is left exactly as
it was, hooks, parameters and buffers included.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from prunereg import _compact, _container, _distributed, _method

if TYPE_CHECKING:
    from torch import nn

    from prunereg._method import BasePruningMethod


def pruning_hooks(module: nn.Module, name: str) -> list[tuple[int, BasePruningMethod]]:
    """The (handle id, method) pairs of the pruning hooks acting on ``module.<name>``."""
    return [
        (key, hook)
        for key, hook in module._forward_pre_hooks.items()
        if isinstance(hook, _method.BasePruningMethod) and hook._tensor_name == name
    ]


def prune_tensor(
    cls: type[BasePruningMethod],
    module: nn.Module,
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    importance_scores: torch.Tensor | None,
) -> BasePruningMethod:
    """Prune ``module.<name>`` with ``cls(*args, **kwargs)``; the engine behind ``apply``."""
    hooks = pruning_hooks(module, name)
    if len(hooks) > 1:
        raise AssertionError(
            f"Avoid adding multiple pruning hooks to the same tensor {name} of "
            f"module {module}. Use a PruningContainer."
        )
    method = cls(*args, **kwargs)
    method._tensor_name = name
    return _install(module, name, method, hooks[0][1] if hooks else None, importance_scores)


def install_mask(module: nn.Module, name: str, method: BasePruningMethod, mask: torch.Tensor) -> None:
    """Prune ``module.<name>`` with ``method`` whose final mask is already known.

    Global pruning computes every tensor's combined mask at once; this registers
    that mask as is, without computing it a second time or copying it.
    """
    hooks = pruning_hooks(module, name)
    method._tensor_name = name
    _install(module, name, method, hooks[0][1] if hooks else None, None, mask=mask)


def _install(
    module: nn.Module,
    name: str,
    method: BasePruningMethod,
    old: BasePruningMethod | None,
    importance_scores: torch.Tensor | None,
    mask: torch.Tensor | None = None,
) -> BasePruningMethod:
    orig = getattr(module, name)
    importance_scores = scores_for(orig, importance_scores, f"parameter {name} of {module}")

    if old is None:
        if not isinstance(orig, torch.nn.Parameter):
            raise TypeError(
                f"cannot assign '{torch.typename(orig)}' object to parameter "
                f"'{name}_orig' (torch.nn.Parameter or None required)"
            )
        hook = method
        if mask is None:
            mask = method.compute_mask(importance_scores, default_mask=torch.ones_like(orig))
    else:
        hook = old if isinstance(old, _container.PruningContainer) else _container.PruningContainer(old)
        if mask is None:
            default_mask = getattr(module, name + "_mask").detach()
            if default_mask.dtype == torch.bool:  # compact storage: methods see the usual dtype
                default_mask = default_mask.to(orig.dtype)
            mask = _container.combine_masks(method, importance_scores, default_mask)
    mask = _compact.stored(mask, orig.dtype, module._buffers.get(name + "_mask") if old is not None else None)

    with all_or_nothing([(module, name)]):
        if old is None:
            hook._param_order = _parameter_order(module, name)
            module.register_parameter(name + "_orig", orig)
            del module._parameters[name]
        else:
            hook._param_order = getattr(old, "_param_order", None)
            hook.add_pruning_method(method)
            for key, _ in pruning_hooks(module, name):
                del module._forward_pre_hooks[key]
        module.register_buffer(name + "_mask", mask)
        set_pruned_tensor(hook, module)
        module.register_forward_pre_hook(hook)
    return hook


def scores_for(t: torch.Tensor, importance_scores: torch.Tensor | None, what: str) -> torch.Tensor:
    """What to rank ``t``'s entries by: ``importance_scores`` of ``t``'s shape, laid out like ``t``, or ``t``."""
    if importance_scores is None:
        return t
    if importance_scores.shape != t.shape:
        raise AssertionError(
            f"importance_scores should have the same shape as {what}, "
            f"got {importance_scores.shape} vs {t.shape}"
        )
    return _distributed.to_layout_of(importance_scores, t)


@contextmanager
def all_or_nothing(tensors: list[tuple[nn.Module, str]]) -> Iterator[None]:
    """Undo every pruning change made to these ``(module, name)`` tensors if the block raises."""
    snapshots = [_Snapshot(module, name) for module, name in tensors]
    try:
        yield
    except BaseException:
        for snapshot in reversed(snapshots):
            snapshot.restore()
        raise


class _Snapshot:
    """What pruning may change on one module for one tensor name."""

    def __init__(self, module: nn.Module, name: str) -> None:
        self.module = module
        self.name = name
        self.parameters = dict(module._parameters)
        self.buffers = dict(module._buffers)
        self.hooks = dict(module._forward_pre_hooks)
        self.attribute = module.__dict__.get(name, _MISSING)
        self.hook_states = [(h, dict(h.__dict__)) for _, h in pruning_hooks(module, name)]

    def restore(self) -> None:
        module = self.module
        _refill(module._parameters, self.parameters)
        _refill(module._buffers, self.buffers)
        _refill(module._forward_pre_hooks, self.hooks)
        if self.attribute is _MISSING:
            module.__dict__.pop(self.name, None)
        else:
            module.__dict__[self.name] = self.attribute
        for hook, state in self.hook_states:
            _refill(hook.__dict__, state)


_MISSING = object()


def _refill(target: dict[Any, Any], content: dict[Any, Any]) -> None:
    target.clear()
    target.update(content)


def _parameter_order(module: nn.Module, name: str) -> tuple[str, ...]:
    """The parameter names of ``module`` in their order before any of them was pruned.

    Pruning moves ``<name>_orig`` to the end of ``_parameters`` (as torch does,
    so state_dict keys match); ``remove`` uses this order to put ``<name>`` back
    in its place. Other pruned tensors of the module remember the order from
    before they moved.
    """
    for hook in module._forward_pre_hooks.values():
        order = getattr(hook, "_param_order", None)
        if isinstance(hook, _method.BasePruningMethod) and order is not None and name in order:
            return order
    return tuple(module._parameters)


def set_pruned_tensor(method: BasePruningMethod, module: nn.Module) -> None:
    """Set ``module.<name>`` to the pruned tensor, remembering what it was made of."""
    name = method._tensor_name
    if name in module._parameters:
        _distributed.refuse_gathered_parameter(module, name)
    pruned = method.apply_mask(module)
    setattr(module, name, pruned)
    orig = module._parameters[name + "_orig"]
    mask = module._buffers[name + "_mask"]
    method._refs = (weakref.ref(orig), weakref.ref(mask), weakref.ref(pruned))
    method._stamp = _stamp(orig, mask, pruned)


def pruned_tensor_is_current(method: BasePruningMethod, module: nn.Module) -> bool:
    """Whether ``module.<name>`` still is ``orig * mask`` as :func:`set_pruned_tensor` left it.

    True only if none of the three tensors was replaced, changed in place
    (version counters), given new data (``.data =``, ``.to()``) or a new dtype
    or device since then. The forward pre-hook then skips the multiplication.
    """
    stamp = method.__dict__.get("_stamp")
    if stamp is None:
        return False
    name = method._tensor_name
    orig, mask, pruned = (ref() for ref in method._refs)
    return (
        orig is not None
        and orig is module._parameters.get(name + "_orig")
        and mask is module._buffers.get(name + "_mask")
        and pruned is module.__dict__.get(name)
        and _stamp(orig, mask, pruned) == stamp
    )


def _stamp(orig: torch.Tensor, mask: torch.Tensor, pruned: torch.Tensor) -> tuple[object, ...] | None:
    """What changes when any of the three tensors changes; None where that cannot be told."""
    if orig.is_meta or orig.is_inference() or mask.is_inference() or pruned.is_inference():
        return None  # meta: nothing to save; inference tensors have no version counter
    return (
        orig._version, orig.data_ptr(), orig.dtype, orig.device,
        mask._version, mask.data_ptr(), mask.dtype, mask.device,
        pruned._version,
    )


def make_permanent(method: BasePruningMethod, module: nn.Module) -> None:
    """Write the pruned values into the original Parameter and drop the reparametrization.

    Unlike torch, the parameter returns to its place in ``named_parameters()``
    and keeps its memory format (a channels_last weight stays channels_last).
    """
    name = method._tensor_name
    weight = method.apply_mask(module).detach()
    if hasattr(module, name):
        delattr(module, name)
    orig = module._parameters[name + "_orig"]
    if _distributed.is_dtensor(orig):
        _distributed.write_in_place(orig, weight)
    else:
        if weight.stride() != orig.stride():
            weight = torch.empty_like(orig).copy_(weight)
        orig.data = weight
    del module._parameters[name + "_orig"]
    del module._buffers[name + "_mask"]
    setattr(module, name, orig)
    _restore_place(module._parameters, name, getattr(method, "_param_order", None))


def _restore_place(mapping: dict[str, Any], key: str, order: tuple[str, ...] | None) -> None:
    """Move ``key`` before the first parameter that followed it in ``order``."""
    if order is None or key not in order:
        return
    followers = set(order[order.index(key) + 1 :])
    items = [(k, v) for k, v in mapping.items() if k != key]
    position = next((i for i, (k, _) in enumerate(items) if k in followers), len(items))
    items.insert(position, (key, mapping[key]))
    _refill(mapping, dict(items))


def memoize_pruned_tensor(method: BasePruningMethod, copied: BasePruningMethod, memo: dict[int, Any]) -> None:
    """Teach ``copy.deepcopy`` how to copy the non-leaf tensor ``module.<name>``.

    deepcopy copies a module's parameters and buffers before its hooks, so the
    copies of ``<name>_orig`` and ``<name>_mask`` are in ``memo`` by now: the
    copy of the pruned tensor is recomputed from them, and keeps its autograd
    link to the copied parameter.
    """
    refs = getattr(method, "_refs", None)
    if refs is None:
        return
    orig, mask, pruned = (ref() for ref in refs)
    if pruned is None or pruned.is_leaf or id(pruned) in memo:
        return
    orig_copy = memo.get(id(orig)) if orig is not None else None
    mask_copy = memo.get(id(mask)) if mask is not None else None
    if orig_copy is not None and mask_copy is not None:
        pruned_copy = mask_copy.to(dtype=orig_copy.dtype) * orig_copy
        copied._refs = (weakref.ref(orig_copy), weakref.ref(mask_copy), weakref.ref(pruned_copy))
    else:
        pruned_copy = pruned.detach().clone()
    memo[id(pruned)] = pruned_copy


def remove(module: nn.Module, name: str) -> nn.Module:
    """Make the pruning of ``module.<name>`` permanent and remove its hook."""
    for key, hook in pruning_hooks(module, name):
        hook.remove(module)
        del module._forward_pre_hooks[key]
        return module
    raise ValueError(
        f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed"
    )


def is_pruned(module: nn.Module) -> bool:
    """Whether ``module`` or any of its submodules carries a pruning hook."""
    return any(
        isinstance(hook, _method.BasePruningMethod)
        for submodule in module.modules()
        for hook in submodule._forward_pre_hooks.values()
    )
