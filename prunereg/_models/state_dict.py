"""Moving state dicts between pruned and unpruned models of one architecture."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

from prunereg._core.compact import require_binary
from prunereg._core.reparam import PruningHook, set_pruned_tensor


def load_state_dict(
    model: nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True, assign: bool = False
) -> Any:
    """``model.load_state_dict`` that also accepts the other side of pruning.

    - A pruned state dict (``w_orig`` and ``w_mask``) loads into an unpruned
      model: ``w`` receives ``w_orig * w_mask``.
    - An unpruned state dict (``w``) loads into a pruned model: ``w_orig``
      receives ``w`` and the model keeps its masks.

    Keys already in the model's form load as usual. Afterwards every pruned
    ``module.<name>`` is recomputed, so it is never stale. Returns what
    ``load_state_dict`` returns; ``strict`` and ``assign`` mean what they mean
    there (``assign=True`` fills a model built on the meta device). A mask in
    ``state_dict`` holding values other than 0 and 1 is refused (``ValueError``)
    before anything changes, and so is a tensor whose shape is not the model's
    (``RuntimeError``, as torch raises it, but in one line and with the model
    untouched): smaller tensors are a slimmed model's, and the error says how
    to load them (:func:`_slimmed_hint`).
    """
    for key, tensor in state_dict.items():
        if key.endswith("_mask") and isinstance(tensor, torch.Tensor) and _is_a_pruning_mask(model, state_dict, key):
            require_binary(key.removesuffix("_mask"), tensor)
    translated = dict(state_dict)
    pruned = []
    for prefix, module in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, torch_prune.BasePruningMethod):  # torch's own hooks too
                pruned.append((module, cast(PruningHook, hook)))
                _to_pruned(translated, dot + hook._tensor_name, module._buffers[hook._tensor_name + "_mask"])
        for name in module._parameters:
            _to_unpruned(translated, dot + name)
    _require_the_model_s_shapes(model, translated)
    result = model.load_state_dict(translated, strict=strict, assign=assign)
    for module, hook in pruned:
        set_pruned_tensor(hook, module)
    return result


def _require_the_model_s_shapes(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Refuse the first tensor whose shape is not the model's, before ``load_state_dict`` copies the others."""
    own = model.state_dict(keep_vars=True)
    for key, tensor in state.items():
        mine = own.get(key)
        if isinstance(tensor, torch.Tensor) and isinstance(mine, torch.Tensor) and tensor.shape != mine.shape:
            shapes = f"the state dict's is {list(tensor.shape)}, the model's {list(mine.shape)}"
            smaller = tensor.dim() == mine.dim() and all(a <= b for a, b in zip(tensor.shape, mine.shape))
            raise RuntimeError(f"size mismatch for {key}: {shapes}" + (f"; {_slimmed_hint()}" if smaller else ""))


def _slimmed_hint() -> str:
    return (
        "a slimmed model's weights load into a model given their shapes first: "
        "prunereg.apply_slimmed_shapes(model, shapes) with the prunereg.slimmed_shapes(model) saved beside them, "
        "or save the whole model (torch.save, then torch.load(..., weights_only=True) within prunereg.safe_globals)"
    )


def _is_a_pruning_mask(model: nn.Module, state: Mapping[str, torch.Tensor], key: str) -> bool:
    """Whether ``state[key]`` is the mask of a pruned tensor: paired with ``<name>_orig`` here or in the model."""
    name = key.removesuffix("_mask")
    if name + "_orig" in state:
        return True
    module_name, _, tensor_name = name.rpartition(".")
    try:
        module = model.get_submodule(module_name)
    except AttributeError:
        return False
    return any(
        getattr(hook, "_tensor_name", None) == tensor_name
        for hook in module._forward_pre_hooks.values()
        if isinstance(hook, torch_prune.BasePruningMethod)
    )


def _to_pruned(state: dict[str, torch.Tensor], key: str, model_mask: torch.Tensor) -> None:
    if key in state and key + "_orig" not in state:
        state[key + "_orig"] = state.pop(key)
        state.setdefault(key + "_mask", model_mask)


def _to_unpruned(state: dict[str, torch.Tensor], key: str) -> None:
    orig, mask = state.get(key + "_orig"), state.get(key + "_mask")
    if key not in state and orig is not None and mask is not None:
        state[key] = mask.to(dtype=orig.dtype) * orig
        del state[key + "_orig"], state[key + "_mask"]
