"""The reparametrization: ``<name>_orig`` parameter, ``<name>_mask`` buffer, forward pre-hook.

Pruning ``module.<name>`` moves the Parameter object itself to ``<name>_orig``
(so optimizers keep working), stores the mask as the buffer ``<name>_mask`` and
sets ``module.<name> = orig * mask`` now and before every forward. Every change
to a module here is all-or-nothing: on any error the module is left exactly as
it was, hooks, parameters and buffers included.

:class:`PruningHook` owns the tensor name: it is the forward pre-hook, and every
pruning method (:class:`prunereg.BasePruningMethod`) is one. It subclasses
torch's ``BasePruningMethod``, so torch's ``is_pruned`` and ``remove`` (and
Lightning's ``ModelPruning``) take prunereg's methods and modules; the other
way round, every function here also sees the hooks ``torch.nn.utils.prune``
installed, so prunereg's ``is_pruned``, ``remove`` and re-pruning work on
modules torch pruned. Which mask to
install is the methods' business (:mod:`prunereg._core.method`); this module only
installs it, keeps ``module.<name>`` current and takes it away again.
"""

from __future__ import annotations

import copy
import functools
import weakref
from contextlib import AbstractContextManager
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.utils.prune as torch_prune

from prunereg._distributed import layout

if TYPE_CHECKING:
    from torch import nn


class PruningHook(torch_prune.BasePruningMethod):
    """The forward pre-hook that keeps ``module.<name>`` equal to ``<name>_orig * <name>_mask``.

    Before every forward it recomputes the product, except with autograd off
    when neither tensor changed since the last time (then ``<name>`` already
    holds that product, and a no_grad forward costs what the unpruned model's does).
    Traced by ``torch.compile`` or ``torch.export`` it is the plain product:
    the change detection reads version counters and data pointers, which
    tracing cannot follow.
    """

    _tensor_name: str
    _param_order: tuple[str, ...] | None  # the module's parameter order before the first pruning
    # What module.<name> was made of, and when (see set_pruned_tensor); never pickled.
    _refs: tuple[weakref.ref[torch.Tensor], weakref.ref[torch.Tensor], weakref.ref[torch.Tensor]]
    _stamp: tuple[object, ...] | None
    _shared_with: tuple[str, ...]  # a tied parameter's names, when pruned together (prunereg._core.tied)
    _shared_as: str  # this hook's own name among them

    def __call__(self, module: nn.Module, inputs: Any) -> None:
        name = self._tensor_name
        if name + "_orig" not in module._parameters and name + "_mask" not in module._buffers:
            # quantize_dynamic copies the hooks of the modules it replaces onto the
            # new ones, which were built from the pruned tensor and hold no mask.
            return
        if torch.compiler.is_compiling():
            setattr(module, name, self.apply_mask(module))
            return
        # With autograd on, the product must be recomputed: it links <name> to
        # <name>_orig in this forward's graph.
        if torch.is_grad_enabled() or not pruned_tensor_is_current(self, module):
            set_pruned_tensor(self, module)

    def apply_mask(self, module: nn.Module) -> torch.Tensor:
        """The pruned tensor, ``<name>_orig * <name>_mask``, in the original's dtype."""
        if self._tensor_name is None:
            raise AssertionError(f"Module {module} has to be pruned")
        return _product(*_factors(module, self._tensor_name))

    def remove(self, module: nn.Module) -> None:
        """Make the pruning permanent: ``<name>`` becomes a plain parameter holding the pruned values."""
        if self._tensor_name is None:
            raise AssertionError(f"Module {module} has to be pruned before pruning can be removed")
        make_permanent(self, module)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_refs", None)
        state.pop("_stamp", None)
        return state

    def __deepcopy__(self, memo: dict[int, Any]) -> PruningHook:
        # torch's methods make deepcopy of a pruned module fail (pytorch#37322).
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__dict__.update(copy.deepcopy(self.__getstate__(), memo))
        memoize_pruned_tensor(self, copied, memo)
        return copied


def pruning_hooks(module: nn.Module, name: str) -> list[tuple[int, PruningHook]]:
    """The (handle id, hook) pairs of the pruning hooks acting on ``module.<name>``, torch's included."""
    if not module._forward_pre_hooks:  # most modules pruned in a loop: no comprehension to run
        return []
    return [
        (key, cast(PruningHook, hook))  # torch's own hooks are used through the same attributes
        for key, hook in module._forward_pre_hooks.items()
        if isinstance(hook, torch_prune.BasePruningMethod) and hook._tensor_name == name
    ]


_UNSET = object()  # an argument not given (None is a value module.<name> may hold)

Hooks = list[tuple[int, PruningHook]]
"""What :func:`pruning_hooks` returns: the functions below take it from a caller that looked it up already."""


def check_prunable(module: nn.Module, name: str, hooks: Hooks | None = None, orig: object = _UNSET) -> None:
    """Refuse to prune ``module.<name>`` for the first time unless it is a Parameter (torch's error).

    ``hooks``: its :func:`pruning_hooks`, ``orig``: ``module.<name>``, when the caller has them.
    """
    orig = getattr(module, name) if orig is _UNSET else orig
    hooks = pruning_hooks(module, name) if hooks is None else hooks
    # type() first: Parameter's isinstance runs a Python __instancecheck__.
    if not hooks and type(orig) is not torch.nn.Parameter and not isinstance(orig, torch.nn.Parameter):
        raise TypeError(
            f"cannot assign '{torch.typename(orig)}' object to parameter "
            f"'{name}_orig' (torch.nn.Parameter or None required)"
        )


def install(module: nn.Module, name: str, hook: PruningHook, mask: torch.Tensor, hooks: Hooks | None = None) -> None:
    """Make ``hook`` the one pruning hook of ``module.<name>``, with ``mask`` as ``<name>_mask``.

    The first pruning moves the parameter to ``<name>_orig``; a later one
    replaces the earlier hook (``hook`` then holds its history). Call
    :func:`check_prunable` first, and this inside an :func:`all_or_nothing`
    block over the tensor (every pruning call opens one): that block undoes a
    half-done install. ``hooks``: the tensor's :func:`pruning_hooks` before
    this call, when the caller has them.
    """
    hooks = pruning_hooks(module, name) if hooks is None else hooks
    if not hooks:
        orig = module._parameters[name]
        hook._param_order = _parameter_order(module, name)
        _register(module, "_parameters", name + "_orig", orig)
        del module._parameters[name]
    else:
        for key, old in hooks:
            if old is not hook:
                hook._param_order = getattr(old, "_param_order", None)
            del module._forward_pre_hooks[key]
    _register(module, "_buffers", name + "_mask", mask)
    set_pruned_tensor(hook, module)
    module.register_forward_pre_hook(hook)


def _register(module: nn.Module, slot: str, key: str, value: torch.Tensor | None) -> None:
    """``module.register_parameter(key, value)`` (``slot`` ``"_parameters"``) or ``register_buffer``, persistent.

    Inserted straight into the dict where torch's checks would pass and no
    global registration hook would see it: the same entry, without the
    ``hasattr`` that raises and catches an AttributeError for a new name (on
    a small layer, the two registrations cost more than its mask's ranking).
    Anything else (a class or instance with its own registration or
    attribute lookup, a name an attribute holds, a tensor subclass or one
    that is not a leaf) takes the module's own method and its errors.
    """
    parameters = slot == "_parameters"
    cls: type = type(module)
    if (
        _plain_registration(cls)
        and ("register_parameter" if parameters else "register_buffer") not in module.__dict__  # no own method
        and key not in module.__dict__
        and key not in module._modules
        and (key not in module._buffers if parameters else key not in module._parameters)
        and "." not in key
        and not _class_holds(cls, key)
        and not (_GLOBAL_PARAMETER_HOOKS if parameters else _GLOBAL_BUFFER_HOOKS)
        and (type(value) is torch.nn.Parameter if parameters else type(value) is torch.Tensor)
        and value.grad_fn is None  # type: ignore[union-attr]  # a Tensor by now
    ):
        getattr(module, slot)[key] = value  # an existing entry under key is replaced, as torch's methods do
        if not parameters:
            module._non_persistent_buffers_set.discard(key)
    elif parameters:
        module.register_parameter(key, value)  # type: ignore[arg-type]  # a Parameter: check_prunable refused others
    else:
        module.register_buffer(key, value)


@functools.cache
def _plain_registration(cls: type) -> bool:
    """Whether ``cls`` registers parameters and buffers, and looks attributes up, as ``nn.Module`` does."""
    return (
        cls.register_parameter is torch.nn.Module.register_parameter  # type: ignore[attr-defined]
        and cls.register_buffer is torch.nn.Module.register_buffer  # type: ignore[attr-defined]
        and cls.__getattr__ is torch.nn.Module.__getattr__  # type: ignore[attr-defined]
        and cls.__getattribute__ is object.__getattribute__
    )


@functools.lru_cache(maxsize=1024)
def _class_holds(cls: type, key: str) -> bool:
    """Whether ``cls`` or a base defines an attribute ``key`` (then ``hasattr`` would find it on any instance)."""
    return any(key in vars(base) for base in cls.__mro__)


# Torch's global registration hooks; where a torch lacks them, every registration takes torch's own method.
_GLOBAL_PARAMETER_HOOKS: dict[int, Any] = getattr(
    torch.nn.modules.module, "_global_parameter_registration_hooks", {0: None}
)
_GLOBAL_BUFFER_HOOKS: dict[int, Any] = getattr(torch.nn.modules.module, "_global_buffer_registration_hooks", {0: None})


def scores_for(t: torch.Tensor, importance_scores: torch.Tensor | None, what: str) -> torch.Tensor:
    """What to rank ``t``'s entries by: ``importance_scores`` of ``t``'s shape, laid out like ``t``, or ``t``."""
    if importance_scores is None:
        return t
    if importance_scores.shape != t.shape:
        raise AssertionError(
            f"importance_scores should have the same shape as {what}, got {importance_scores.shape} vs {t.shape}"
        )
    return layout.to_layout_of(importance_scores, t)


def all_or_nothing(tensors: list[tuple[nn.Module, str]]) -> AbstractContextManager[None]:
    """Undo every pruning change made to these ``(module, name)`` tensors if the block raises."""
    return _AllOrNothing(tensors)


class _AllOrNothing(AbstractContextManager[None]):
    """:func:`all_or_nothing`'s block: a class rather than a generator, as every pruning call opens one."""

    def __init__(self, tensors: list[tuple[nn.Module, str]]) -> None:
        self.snapshots = tuple([_Snapshot(module, name) for module, name in tensors])

    def __enter__(self) -> None:
        self.opened = _open_snapshots.set(_open_snapshots.get() + self.snapshots)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if kind is not None:
                for snapshot in reversed(self.snapshots):
                    snapshot.restore()
        finally:
            _open_snapshots.reset(self.opened)


def all_or_nothing_first(module: nn.Module, name: str) -> AbstractContextManager[None]:
    """:func:`all_or_nothing` for one pruning call's block over ``module.<name>`` alone, lighter where it can be.

    The loop over a model's layers prunes each one for the first time: a
    module without forward pre-hooks, whose hooks' states need no copy (with
    hooks, this is :func:`all_or_nothing`). Its undo log
    holds the module's ``_parameters`` and ``_buffers`` as they were (plain
    dict copies), restores them, drops the hooks the block added and puts back
    ``module.<name>``: the same state a snapshot restores. Unlike
    :func:`all_or_nothing` it is not listed for :func:`snapshot_parameters`:
    only for a block that counts no references to the parameter (a pruning
    call counts them before it opens its block); one that did would only take
    the slower exact look (a gc scan), never a wrong answer.
    """
    if module._forward_pre_hooks:
        return _AllOrNothing([(module, name)])
    return _FirstPruning(module, name)


class _FirstPruning(AbstractContextManager[None]):
    """:func:`all_or_nothing_first`'s undo log."""

    __slots__ = ("attribute", "buffers", "module", "name", "parameters")

    def __init__(self, module: nn.Module, name: str) -> None:
        self.module = module
        self.name = name
        self.parameters = module._parameters.copy()
        self.buffers = module._buffers.copy()
        self.attribute = module.__dict__.get(name, _MISSING)

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            return
        module = self.module
        _refill(module._parameters, self.parameters)
        _refill(module._buffers, self.buffers)
        module._forward_pre_hooks.clear()  # it had none
        if self.attribute is _MISSING:
            module.__dict__.pop(self.name, None)
        else:
            module.__dict__[self.name] = self.attribute


def snapshot_parameters() -> list[dict[str, torch.nn.Parameter | None]]:
    """The copies of ``_parameters`` that the :func:`all_or_nothing` blocks now open hold.

    They reference the parameters too, which :mod:`prunereg._core.tied` must not
    take for another module sharing them.
    """
    return [snapshot.parameters for snapshot in _open_snapshots.get()]


class _Snapshot:
    """What pruning may change on one module for one tensor name."""

    __slots__ = ("attribute", "buffers", "hook_states", "hooks", "module", "name", "parameters")

    def __init__(self, module: nn.Module, name: str) -> None:
        self.module = module
        self.name = name
        self.parameters = module._parameters.copy()
        self.buffers = module._buffers.copy()
        self.hooks = dict(module._forward_pre_hooks)
        self.attribute = module.__dict__.get(name, _MISSING)
        # Every pruning hook of the module (a copy of their state is what a lookup of this name's would save).
        self.hook_states = (
            [(h, dict(h.__dict__)) for h in self.hooks.values() if isinstance(h, torch_prune.BasePruningMethod)]
            if self.hooks
            else []
        )

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
_open_snapshots: ContextVar[tuple[_Snapshot, ...]] = ContextVar("prunereg_open_snapshots", default=())


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
        if isinstance(hook, torch_prune.BasePruningMethod) and order is not None and name in order:
            return order
    return tuple(module._parameters)


def _factors(module: nn.Module, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``<name>_orig`` and ``<name>_mask`` as the forward sees them.

    Straight from their dicts (Module.__getattr__ costs more than the rest on a
    small layer); getattr where they live elsewhere, as torch looks them up.
    """
    orig = module._parameters.get(name + "_orig")
    if orig is None:
        orig = getattr(module, name + "_orig")
    mask = module._buffers.get(name + "_mask")
    if mask is None:
        mask = getattr(module, name + "_mask")
    return orig, mask


def _product(orig: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``orig * mask`` in ``orig``'s dtype."""
    if mask.dtype == torch.bool:  # compact masks: autograd then keeps the bool mask, not a float copy
        return orig * mask
    return mask.to(dtype=orig.dtype) * orig


def set_pruned_tensor(method: PruningHook, module: nn.Module) -> None:
    """Set ``module.<name>`` to the pruned tensor, remembering what it was made of."""
    name = method._tensor_name
    if name in module._parameters:
        layout.refuse_gathered_parameter(module, name)
    held, mask_held = module._parameters.get(name + "_orig"), module._buffers.get(name + "_mask")
    if held is None or mask_held is None or type(method).apply_mask is not PruningHook.apply_mask:
        pruned = method.apply_mask(module)  # a subclass's own product, or tensors that live elsewhere
        orig, mask = orig_and_mask(module, name)
    else:
        orig, mask = held, mask_held
        pruned = _product(orig, mask)
    _set_plain_attribute(module, name, pruned)
    method._refs = (weakref.ref(orig), weakref.ref(mask), weakref.ref(pruned))
    method._stamp = _stamp(orig, mask, pruned)


def _set_plain_attribute(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """``setattr(module, name, value)``, for a plain tensor without Module.__setattr__'s checks where they pass.

    Module.__setattr__ ends in object.__setattr__ for a plain tensor under a name
    that no parameter, buffer or submodule holds; its checks before cost more than
    the rest of setting a small layer's pruned tensor.
    """
    if (
        type(value) is torch.Tensor
        and type(module).__setattr__ is _MODULE_SETATTR
        and name not in module._parameters
        and name not in module._buffers
        and name not in module._modules
    ):
        object.__setattr__(module, name, value)
    else:
        setattr(module, name, value)


_MODULE_SETATTR = torch.nn.Module.__setattr__


def forget_pruned_tensor(method: PruningHook) -> None:
    """Make the next forward recompute ``<name>_orig * <name>_mask``, as a traced one does.

    Slimming's eager capture records the product as the operation it is,
    where a cached product would read as a constant tensor.
    """
    method.__dict__.pop("_stamp", None)


def pruned_tensor_is_current(method: PruningHook, module: nn.Module) -> bool:
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
        orig is module._parameters.get(name + "_orig")
        and mask is module._buffers.get(name + "_mask")
        and pruned is module.__dict__.get(name)
        and orig is not None
        and mask is not None
        and pruned is not None
        and _stamp(orig, mask, pruned) == stamp
    )


def orig_and_mask(module: nn.Module, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``<name>_orig`` and ``<name>_mask`` of a pruned ``module``."""
    orig, mask = module._parameters[name + "_orig"], module._buffers[name + "_mask"]
    if orig is None or mask is None:
        raise RuntimeError(f"{type(module).__name__}.{name} is pruned but {name}_orig or {name}_mask is None")
    return orig, mask


def _stamp(orig: torch.Tensor, mask: torch.Tensor, pruned: torch.Tensor) -> tuple[object, ...] | None:
    """What changes when any of the three tensors changes; None where that cannot be told."""
    if orig.is_meta or orig.is_inference() or mask.is_inference() or pruned.is_inference():
        return None  # meta: nothing to save; inference tensors have no version counter
    return (
        orig._version,
        orig.data_ptr(),
        orig.dtype,
        orig.device,
        mask._version,
        mask.data_ptr(),
        mask.dtype,
        mask.device,
        pruned._version,
    )


def make_permanent(method: PruningHook, module: nn.Module) -> None:
    """Write the pruned values into the original Parameter and drop the reparametrization.

    Unlike torch, the parameter returns to its place in ``named_parameters()``
    and keeps its memory format (a channels_last weight stays channels_last).
    """
    name = method._tensor_name
    weight = method.apply_mask(module).detach()
    if hasattr(module, name):
        delattr(module, name)
    orig, _ = orig_and_mask(module, name)
    layout.assign_values(orig, weight)
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


def memoize_pruned_tensor(method: PruningHook, copied: PruningHook, memo: dict[int, Any]) -> None:
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


def remove(module: nn.Module, name: str, hooks: Hooks | None = None) -> nn.Module:
    """Make the pruning of ``module.<name>`` permanent and remove its hook (``hooks``: its :func:`pruning_hooks`)."""
    for key, hook in pruning_hooks(module, name) if hooks is None else hooks:
        hook.remove(module)
        del module._forward_pre_hooks[key]
        return module
    raise ValueError(f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed")


def is_pruned(module: nn.Module) -> bool:
    """Whether ``module`` or any of its submodules carries a pruning hook (prunereg's or torch's)."""
    return any(
        isinstance(hook, torch_prune.BasePruningMethod)
        for submodule in module.modules()
        for hook in submodule._forward_pre_hooks.values()
    )
