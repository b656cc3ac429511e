"""Saving and loading pruned Hugging Face models without losing a pruned weight.

``model.save_pretrained`` of a pruned model writes ``<name>_orig`` and
``<name>_mask``; ``from_pretrained`` of that folder calls them unexpected and
initialises every pruned weight at random, with a warning only. Here:

- :func:`save_pretrained` writes the folder any transformers install loads
  with the pruned values (plain ``<name>`` keys), and the masks beside it in
  ``prunereg_masks.safetensors``;
- :func:`from_pretrained` loads such a folder and prunes the model again with
  those masks, so fine-tuning goes on with the pruning kept. It also restores a
  folder written by a plain ``save_pretrained`` of a pruned model.

The masks file records a digest of the zeros of the weights it was saved with;
:func:`from_pretrained` refuses a masks file whose weights have changed since (a
model saved over the folder later), and masks holding values other than 0 and 1.

Only the models' own ``save_pretrained``/``from_pretrained`` are called:
transformers is not imported here.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

from prunereg._core import reparam
from prunereg._core import tied as _tied
from prunereg._core.compact import require_binary
from prunereg._core.custom import CustomFromMask
from prunereg._disk.model_dir import (
    CONFIG_NAME,
    check_model_folder,
    read_json,
    replace_hint,
    safetensors_weight_map,
    weight_files,
)
from prunereg._disk.safetensors_file import open_safetensors
from prunereg._models.hf_folder import check_folder
from prunereg._models.slimmed import CONFIG_KEY, apply_slimmed_shapes
from prunereg._progress import library_bars
from prunereg._text import quoted

MASKS_FILE = "prunereg_masks.safetensors"
"""The file :func:`save_pretrained` writes the masks to, beside the model's weights."""
WEIGHT_ZEROS_KEY = "prunereg.weight_zeros"
"""The masks file's metadata entry: JSON mapping each mask's name to :func:`zeros_digest` of its saved weight."""


def save_pretrained(model: nn.Module, save_directory: str | os.PathLike[str], **kwargs: Any) -> None:
    """``model.save_pretrained(save_directory, **kwargs)`` with the pruned values, and the masks beside them.

    Plain ``from_pretrained`` loads the folder with every pruned weight as
    pruned; :func:`from_pretrained` also restores the masks. The model itself
    is not changed. A parameter pruned in one module but used unpruned by
    another (a tied embedding pruned through its head only) is refused with a
    ``ValueError`` naming both, as the saved folder could not hold both values.
    """
    refuse_divergent_ties(model)
    plain, masks = _plain_state_and_masks(model)
    digests = {name: zeros_digest(plain[name]) for name in masks}  # before transformers drops tied names
    path = Path(save_directory) / MASKS_FILE
    path.unlink(missing_ok=True)  # never left beside weights it does not belong to, even if the save fails
    model.save_pretrained(save_directory, state_dict=plain, **kwargs)  # type: ignore[operator]
    if masks:
        metadata = {"format": "pt", WEIGHT_ZEROS_KEY: json.dumps(digests, sort_keys=True)}
        safetensors.torch.save_file({n: m.contiguous() for n, m in masks.items()}, str(path), metadata=metadata)


def from_pretrained(model_class: Any, pretrained: str | os.PathLike[str], **kwargs: Any) -> nn.Module:
    """``model_class.from_pretrained(pretrained, **kwargs)``, pruned again as it was saved.

    The masks come from :data:`MASKS_FILE` (written by :func:`save_pretrained`),
    or from the ``<name>_orig``/``<name>_mask`` tensors a plain
    ``save_pretrained`` of a pruned model wrote; those load as the pruned
    values, never as random ones. Each mask is applied with ``custom_from_mask``
    from the model, so tied parameters are pruned everywhere they are used.

    A masks file saved with other weights than the folder holds now (the zeros
    differ: a model was saved over the folder since) is refused with a
    ``ValueError`` naming a tensor that differs, as are masks holding values
    other than 0 and 1. The folder is read as untrusted input: no code of its
    own runs (``trust_remote_code=False`` unless you pass it), no link out of
    it is followed, and anything in it but a regular file no larger than its
    kind (a FIFO as the weights or the masks) is refused before anything is
    read, as ``prunereg oneshot`` refuses it (``CheckpointError``); so is a
    ``config.json`` giving a count or width its weights cannot hold
    (``ValueError``), before any model is built.
    """
    folder = Path(pretrained)
    kwargs.setdefault("trust_remote_code", False)
    local = folder.is_dir()
    slimmed = local and _checked_is_slimmed(folder, kwargs.get("config"))
    masks: dict[str, torch.Tensor] = {}
    if slimmed:
        config = kwargs.get("config") or model_class.config_class.from_pretrained(
            pretrained, trust_remote_code=kwargs["trust_remote_code"]
        )
        model = _slimmed_from_folder(model_class, folder, config, kwargs)
    elif local and _has_pruned_keys(folder):
        state = {}
        for file in weight_files(folder, "pretrained").files:
            with open_safetensors(file, replace_hint(file.name)) as handle:
                state.update({key: handle.get_tensor(key) for key in handle.keys()})  # noqa: SIM118
        state, masks = _split_pruned(state)
        # transformers takes a state dict only in place of a folder, so the config comes separately.
        config = kwargs.pop("config", None) or model_class.config_class.from_pretrained(
            pretrained, trust_remote_code=kwargs["trust_remote_code"]
        )
        with library_bars():
            model = model_class.from_pretrained(None, config=config, state_dict=state, **kwargs)
    else:
        with library_bars():
            model = model_class.from_pretrained(pretrained, **kwargs)
    if local and os.path.lexists(folder / MASKS_FILE):
        masks.update(_checked_masks_file(folder, model))
    for name, mask in masks.items():
        site = _tied.resolve(model, name)
        if not reparam.pruning_hooks(site.module, site.name):  # a tied parameter is pruned with its group
            CustomFromMask.apply(model, name, mask.to(getattr(site.module, site.name).device))
    return model


def _checked_is_slimmed(folder: Path, config: Any) -> bool:
    """The folder checked as the commands check it, and whether its model records shapes ``prunereg.slim`` made.

    ``config.json`` is checked against the weights' headers too, unless a ``config`` is given (transformers then
    does not read it) or it records slimmed shapes (its sizes are the model's before slimming).
    """
    slimmed = _is_slimmed(folder, config)
    if config is None and not slimmed:
        check_folder(folder, "pretrained")
    else:
        check_model_folder(folder, "pretrained")
    return slimmed


def _is_slimmed(folder: Path, config: Any) -> bool:
    """Whether the config (given, or the folder's ``config.json``) records shapes ``prunereg.slim`` made."""
    if config is not None:
        return bool(getattr(config, CONFIG_KEY, None))
    if not os.path.lexists(folder / CONFIG_NAME):
        return False
    try:
        return bool(read_json(folder, CONFIG_NAME, "pretrained").get(CONFIG_KEY))
    except (ValueError, AttributeError):
        return False  # transformers reports a config that is not JSON, or not an object, itself


def _slimmed_from_folder(model_class: Any, folder: Path, config: Any, kwargs: dict[str, Any]) -> nn.Module:
    """A model ``prunereg.slim`` made narrower than its config states, loaded by transformers itself.

    transformers builds the model (a subclass that takes the recorded shapes
    as soon as it is built) and loads the weights with its own key mapping and
    checks; the model is then of ``model_class`` again.
    """
    record = getattr(config, CONFIG_KEY)

    class Slimmed(model_class):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            apply_slimmed_shapes(self, record)

    Slimmed.__name__, Slimmed.__qualname__ = model_class.__name__, model_class.__qualname__
    Slimmed.__module__ = model_class.__module__
    kwargs = {key: value for key, value in kwargs.items() if key != "config"}
    with library_bars():
        model = Slimmed.from_pretrained(folder, config=config, **kwargs)
    model.__class__ = model_class
    return model


def refuse_divergent_ties(model: nn.Module) -> None:
    """Raise ``ValueError`` if a parameter is pruned where one module holds it and unpruned where another does."""
    pruned: dict[int, str] = {}
    plain: dict[int, str] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        site = _tied.resolve(model, name)
        base = site.name.removesuffix("_orig")
        if site.name.endswith("_orig") and reparam.pruning_hooks(site.module, base):
            pruned.setdefault(id(parameter), name.removesuffix("_orig"))
        else:
            plain.setdefault(id(parameter), name)
    for key in pruned.keys() & plain.keys():
        raise ValueError(
            f"{pruned[key]} is pruned but {plain[key]}, which shares its parameter, is not: prune it from the "
            f"model so both are, e.g. prune.l1_unstructured(model, {pruned[key]!r}, ...)"
        )


def _plain_state_and_masks(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The state dict with every pruned tensor under its own name, and one mask per pruned parameter.

    Tied members get the same product tensor (so transformers sees them tied)
    and one mask entry between them.
    """
    state = model.state_dict()
    masks: dict[str, torch.Tensor] = {}
    products: dict[int, torch.Tensor] = {}
    for name, module, hook in _pruned_tensors(model):
        orig = module._parameters[hook._tensor_name + "_orig"]
        mask = module.get_buffer(hook._tensor_name + "_mask")
        product = products.get(id(orig))
        if product is None:
            product = products[id(orig)] = hook.apply_mask(module).detach()
            masks[name] = mask.detach()
        state[name] = product
        state.pop(name + "_orig", None)
        state.pop(name + "_mask", None)
    return state, masks


def _pruned_tensors(model: nn.Module) -> Iterator[tuple[str, nn.Module, torch.nn.utils.prune.BasePruningMethod]]:
    for prefix, module in model.named_modules(remove_duplicate=False):
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, torch.nn.utils.prune.BasePruningMethod):
                yield (f"{prefix}." if prefix else "") + hook._tensor_name, module, hook


def zeros_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of ``tensor``'s shape and of where it is zero: ties a mask to the weights it was saved with."""
    zeros = (tensor.detach() == 0).to("cpu").contiguous()
    digest = hashlib.sha256(repr(tuple(zeros.shape)).encode())
    if zeros.numel():
        digest.update((ctypes.c_ubyte * zeros.numel()).from_address(zeros.data_ptr()))  # bool: one byte each
    return digest.hexdigest()


def _checked_masks_file(folder: Path, model: nn.Module) -> dict[str, torch.Tensor]:
    """The masks in ``folder``'s :data:`MASKS_FILE`, once they are known to belong to its weights.

    Each mask's weight is read as the folder's files hold it (a model loaded in
    another dtype may round small weights to zero); one stored under another
    name (a tied head) is taken from ``model``.
    """
    with open_safetensors(folder / MASKS_FILE, replace_hint(MASKS_FILE)) as handle:
        metadata = handle.metadata() or {}
        masks = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    for name, mask in masks.items():
        require_binary(name, mask)
    recorded = json.loads(metadata[WEIGHT_ZEROS_KEY]) if WEIGHT_ZEROS_KEY in metadata else None
    weights = _saved_weights(folder, masks)
    for name, mask in masks.items():
        weight = weights.get(name)
        if weight is None:
            site = _tied.resolve(model, name)
            weight = getattr(site.module, site.name)
        if recorded is not None:
            belongs = recorded.get(name) == zeros_digest(weight)
        else:  # an older prunereg recorded nothing: at least every pruned entry must be zero
            belongs = bool((weight[mask.to(weight.device) == 0] == 0).all())
        if not belongs:
            raise ValueError(
                f"{MASKS_FILE} in {quoted(folder)} was saved with other weights than the folder holds now ({name} "
                "differs): it is stale; load the folder with transformers' from_pretrained, or delete the masks file"
            )
    if recorded is None:
        warnings.warn(
            f"{MASKS_FILE} in {quoted(folder)} records no digest of its weights (an older prunereg wrote it); "
            "its masks are applied since their zeros are zeros of the weights; save again with "
            "prunereg.save_pretrained to tie them",
            UserWarning,
            stacklevel=3,
        )
    return masks


def _saved_weights(folder: Path, masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights named in ``masks`` as the folder's safetensors files hold them (not as loaded: no dtype change)."""
    try:
        files = safetensors_weight_map(folder, "pretrained")
    except (FileNotFoundError, ValueError):
        return {}
    found = {}
    for name in masks:
        key = next((k for k in (name, name.partition(".")[2]) if k in files), None)
        if key is not None:
            with open_safetensors(files[key], replace_hint(files[key].name)) as handle:
                found[name] = handle.get_tensor(key)
    return found


def _has_pruned_keys(folder: Path) -> bool:
    for file in weight_files(folder, "pretrained").files:
        if file.suffix != ".safetensors":
            continue
        with open_safetensors(file, replace_hint(file.name)) as handle:
            if any(key.endswith("_orig") for key in handle.keys()):  # noqa: SIM118  # safe_open has no __iter__
                return True
    return False


def _split_pruned(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``state`` with ``<name>_orig``/``<name>_mask`` pairs turned into ``<name> = orig * mask``, and the masks."""
    masks = {}
    for key in [key for key in state if key.endswith("_orig")]:
        name = key.removesuffix("_orig")
        if name + "_mask" in state:
            orig, mask = state.pop(key), state.pop(name + "_mask")
            require_binary(name, mask)
            state[name] = mask.to(orig.dtype) * orig
            masks[name] = mask
    return state, masks
