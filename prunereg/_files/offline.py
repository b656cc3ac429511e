"""Pruning a model file's tensors without building the model, and giving a model its masks back.

Each tensor gets exactly what ``torch.nn.utils.prune`` would give the parameter
holding it: a fresh method's ``compute_mask(t, ones_like(t))``, or, pruned
together, its share of :func:`prunereg._core.global_pruning.global_masks`; the pruned value
is ``mask * t``, as a pruned module computes it. A tensor pruned before (its
mask given) is pruned again as torch re-prunes a parameter: the new method acts
on what the old mask left, as in a ``PruningContainer``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunereg._core import reparam
from prunereg._core import tied as _tied
from prunereg._core.compact import is_binary, require_binary
from prunereg._core.custom import CustomFromMask
from prunereg._core.global_pruning import global_masks
from prunereg._core.method import BasePruningMethod
from prunereg._distributed.remaining import combine_masks
from prunereg._files import checkpoint as _checkpoint
from prunereg._plugins.kinds import kind_names
from prunereg._plugins.loading import registry
from prunereg._plugins.registry import (
    PluginError,
    PluginWarning,
    UnknownMethodError,
    constructor_parameters,
    untaken_argument,
)
from prunereg._text import describe

MethodFactory = Callable[[], BasePruningMethod]


class OfflinePruningError(ValueError):
    """A pruning request that cannot be carried out, said in one line."""


def method_factory(name: str, arguments: Mapping[str, Any], *, together: bool = False) -> MethodFactory:
    """A function building a new registered method ``name`` with ``arguments`` on each call.

    Everything that can be checked without a tensor is checked now: the name
    (:class:`prunereg.UnknownMethodError`, naming the methods a file can be
    pruned with), the argument names against the constructor's signature, the
    values (the method's own validation), and that a method pruning tensors
    ``together`` is ``"unstructured"`` (torch's rule). A method of another
    kind prunes files through its ``as_mask_method()`` (a calibrated method
    that needs no calibration); one that cannot is refused with the command
    that runs it.
    """
    methods = registry()
    try:
        cls: Any = methods.resolve(name)  # a mask method class, or a calibrated one
    except UnknownMethodError:
        if name in methods.methods or name in methods.qualified:
            raise  # registered but unavailable: the registry says why
        raise UnknownMethodError(methods.unknown_message(name, known=file_methods())) from None
    if together and cls.PRUNING_TYPE != "unstructured":
        raise OfflinePruningError(f"global pruning needs an unstructured method; {name!r} is {cls.PRUNING_TYPE}")
    _check_arguments(name, cls, arguments)
    try:
        as_mask(name, cls(**arguments))
    except (TypeError, ValueError) as error:
        if isinstance(error, OfflinePruningError):
            raise
        raise OfflinePruningError(f"bad arguments for method {name!r}: {error}") from error
    return lambda: as_mask(name, cls(**arguments))


def as_mask(name: str, method: object) -> BasePruningMethod:
    """``method`` as a mask method, or :class:`OfflinePruningError` saying where it runs instead."""
    if isinstance(method, BasePruningMethod):
        return method
    convert = getattr(method, "as_mask_method", None)
    if convert is None:
        raise OfflinePruningError(f"method {name!r} is no mask method; it cannot prune a model file")
    try:
        return convert()
    except ValueError as error:
        raise OfflinePruningError(
            f"method {name!r} needs calibration data, which a model file does not hold ({error}): run it on a "
            f"model folder with prunereg oneshot (prunereg.oneshot in Python)"
        ) from error


def file_methods() -> list[str]:
    """The names of the registered methods that prune model files: mask methods, and those needing no calibration."""
    methods = registry()
    found = []
    for name in methods.names():
        if methods.info(name).kind in kind_names(masks=True):
            found.append(name)
            continue
        with warnings.catch_warnings():  # a method that fails to import is simply not listed here
            warnings.simplefilter("ignore", PluginWarning)
            try:
                cls = methods.resolve(name)
            except (UnknownMethodError, PluginError):
                continue
        if getattr(cls, "runs_without_calibration", lambda: False)():
            found.append(name)
    return found


def _check_arguments(name: str, cls: type[BasePruningMethod], arguments: Mapping[str, Any]) -> None:
    parameters = constructor_parameters(cls, evaluated=True)
    if parameters is None:  # no signature to read: the constructor itself will judge
        return
    named = {
        key: parameter
        for key, parameter in parameters.items()
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }
    untaken = untaken_argument(cls, arguments)
    if untaken is not None:
        raise OfflinePruningError(f"method {name!r} {untaken}")
    required = [key for key, parameter in named.items() if parameter.default is parameter.empty]
    for key in required:
        if named[key].annotation in (torch.Tensor, "torch.Tensor", "Tensor"):
            raise OfflinePruningError(
                f"method {name!r} needs a tensor for argument {key!r}, which cannot be given as a value here"
            )
    missing = [key for key in required if key not in arguments]
    if missing:
        raise OfflinePruningError(f"method {name!r} needs argument {missing[0]!r}")


def compute_device(spec: str) -> torch.device:
    """The device named ``spec``, checked to exist here and to hold values (not meta)."""
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError) as error:
        raise OfflinePruningError(f"unknown device {spec!r}: {error}") from error
    if device.type == "meta":
        raise OfflinePruningError("cannot prune on the meta device: its tensors hold no values")
    try:
        torch.empty(1, device=device)
    except Exception as error:  # torch says "not compiled with CUDA", "invalid device ordinal", ...
        raise OfflinePruningError(f"device {spec!r} is not available: {describe(error)}") from error
    return device


def prune(
    tensors: Mapping[str, torch.Tensor],
    make_method: MethodFactory,
    *,
    together: bool = False,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    prior_masks: Mapping[str, torch.Tensor] | None = None,
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """Prune ``tensors`` one by one (or all ``together``); yield ``(name, pruned, bool mask)``.

    Each tensor is a separate parameter to torch: it gets a fresh method, in
    the order given, after ``torch.manual_seed(seed)``. A tensor with a mask in
    ``prior_masks`` (zero: pruned) was pruned before and is given as the
    pruned values; the mask yielded for it includes the old one. Masks are
    computed on ``device`` and come back contiguous, on each tensor's own
    device; pruned tensors keep their dtype.
    """
    prior = {name: _prior_mask(name, mask) for name, mask in (prior_masks or {}).items() if name in tensors}
    if seed is not None:
        torch.manual_seed(seed)
    if together:
        yield from _prune_together(tensors, make_method, device, prior)
        return
    for name, tensor in tensors.items():
        moved = tensor.to(device)
        try:
            if name in prior:
                mask = combine_masks(make_method(), moved, prior[name].to(device=device, dtype=moved.dtype))
            else:
                mask = make_method().compute_mask(moved, torch.ones_like(moved))
        except Exception as error:  # the method's own complaint, tied to the tensor it is about
            raise OfflinePruningError(
                f"cannot prune {name!r} (shape {list(tensor.shape)}): {describe(error)}"
            ) from error
        yield name, *_apply(tensor, moved, mask)


def _prior_mask(name: str, mask: torch.Tensor) -> torch.Tensor:
    """``mask`` checked to be a pruning mask: ones and zeros only."""
    if not is_binary(mask):
        raise OfflinePruningError(f"cannot prune {name!r} again: its mask holds values other than 0 and 1")
    return mask


def _prune_together(
    tensors: Mapping[str, torch.Tensor],
    make_method: MethodFactory,
    device: torch.device | str,
    prior: Mapping[str, torch.Tensor],
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    if not tensors:
        return
    moved = [tensor.to(device) for tensor in tensors.values()]
    old_masks = [
        prior[name].to(device=device, dtype=tensor.dtype) if name in prior else None
        for (name, _), tensor in zip(tensors.items(), moved)
    ]
    try:
        masks = global_masks(make_method(), moved, moved, old_masks)
    except Exception as error:
        raise OfflinePruningError(f"cannot prune the selected tensors together: {describe(error)}") from error
    for (name, tensor), on_device, mask in zip(tensors.items(), moved, masks):
        yield name, *_apply(tensor, on_device, mask)


def _apply(tensor: torch.Tensor, moved: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pruned = mask.to(dtype=moved.dtype) * moved  # what a pruned module computes, NaN * 0 included
    # safetensors writes contiguous tensors only, and a mask takes the layout of a transposed or sliced weight.
    return pruned.to(tensor.device), (mask != 0).to(tensor.device).contiguous()


def apply_masks(model: nn.Module, masks: Mapping[str, torch.Tensor] | str | os.PathLike[str]) -> nn.Module:
    """Prune ``model`` with saved masks, so that training keeps pruned entries at zero.

    ``masks`` maps parameter names (``"encoder.0.weight"``) to masks of their
    shapes (zero: pruned), or is a file that ``prunereg prune --masks`` wrote.
    Each parameter is pruned with ``custom_from_mask``, on top of any earlier
    pruning, named from ``model`` (a tied parameter is pruned everywhere it
    is used). A checkpoint pruned offline fine-tunes with its pruning kept::

        model.load_state_dict(safetensors.torch.load_file("pruned.safetensors"))
        prunereg.apply_masks(model, "masks.safetensors")

    Every name, shape and mask is checked before anything changes (``KeyError``,
    ``ValueError``; a mask holding values other than 0 and 1 is refused), and
    on any failure the model is left as it was.
    """
    if not isinstance(masks, Mapping):
        masks = _checkpoint.read(Path(masks)).tensors
    targets = []
    for name, mask in masks.items():
        module_name, _, tensor_name = name.rpartition(".")
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            module = None
        tensor = getattr(module, tensor_name, None) if module is not None else None
        if module is None or not isinstance(tensor, torch.Tensor):
            raise KeyError(f"the model has no tensor {name!r} to apply its mask to")
        if mask.shape != tensor.shape:
            raise ValueError(f"the mask for {name!r} has shape {list(mask.shape)}, the tensor {list(tensor.shape)}")
        require_binary(name, mask)
        targets.append((name, mask))
        del tensor  # a reference left here would look like another holder to the tie check (a slow scan)
    # Named from the model, a tied parameter (GPT-2's wte and lm_head) is pruned everywhere it is used.
    tied = [(site.module, site.name) for name, _ in targets for site in _tied.sites(model, name)]
    with reparam.all_or_nothing(tied):
        for name, mask in targets:
            CustomFromMask.apply(model, name, mask)
    return model
