"""The record of a slimmed model's new shapes, so that a fresh model of the same class can take its weights.

``prunereg.slim`` removes channels: tensors get smaller and modules' size
attributes (``out_features``, ``groups``, ``num_heads``...) change. The record
is ``{"tensors": {name: shape}, "attributes": {module: {attribute: value}}}``,
kept on the model (:func:`slimmed_shapes`) and, for a Hugging Face model whose
config cannot state the new widths, in its config as ``prunereg_slimmed`` (so
``save_pretrained`` writes it into ``config.json``).
:func:`apply_slimmed_shapes` gives a freshly built model those shapes (zeros),
ready for ``load_state_dict`` of the slimmed weights, and
:func:`prunereg.from_pretrained` does it on its own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

CONFIG_KEY = "prunereg_slimmed"
"""The Hugging Face config attribute holding the record, when the config's own fields cannot state it."""
_ATTRIBUTE = "_prunereg_slimmed"

Record = dict[str, dict[str, Any]]


def snapshot(model: nn.Module) -> Record:
    """Every tensor's shape and every module's integer size attributes, to compare after slimming."""
    tensors = {
        name: list(tensor.shape)
        for name, tensor in [
            *model.named_parameters(remove_duplicate=False),
            *model.named_buffers(remove_duplicate=False),
        ]
    }
    attributes = {name: _size_attributes(module) for name, module in model.named_modules(remove_duplicate=False)}
    return {"tensors": tensors, "attributes": attributes}


def _size_attributes(module: nn.Module) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in module.__dict__.items():
        if key.startswith("_") or key == "training" or isinstance(value, bool):
            continue
        if isinstance(value, int) or (isinstance(value, tuple) and value and all(isinstance(v, int) for v in value)):
            found[key] = list(value) if isinstance(value, tuple) else value
    return found


def record(model: nn.Module, before: Record) -> Record:
    """Add what changed since ``before`` (a :func:`snapshot`) to the model's record; the whole record."""
    after = snapshot(model)
    current = slimmed_shapes(model)
    for name, shape in after["tensors"].items():
        if before["tensors"].get(name) != shape:
            current["tensors"][name] = shape
    for module, attributes in after["attributes"].items():
        old = before["attributes"].get(module, {})
        changed = {key: value for key, value in attributes.items() if old.get(key) != value}
        if changed:
            current["attributes"].setdefault(module, {}).update(changed)
    model.__dict__[_ATTRIBUTE] = current
    return current


def slimmed_shapes(model: nn.Module) -> Record:
    """The shapes and size attributes ``prunereg.slim`` changed in ``model`` (empty for a model never slimmed).

    JSON-ready; save it beside ``torch.save(model.state_dict())`` and give it
    to :func:`apply_slimmed_shapes` of a fresh model before loading the weights.
    """
    found = model.__dict__.get(_ATTRIBUTE)
    if found is None:
        config = getattr(model, "config", None)
        found = getattr(config, CONFIG_KEY, None) if config is not None else None
    found = found or {}
    return {
        "tensors": dict(found.get("tensors", {})),
        "attributes": {k: dict(v) for k, v in found.get("attributes", {}).items()},
    }


def apply_slimmed_shapes(model: nn.Module, shapes: Record) -> nn.Module:
    """Give a freshly built ``model`` the shapes of a slimmed one (new tensors are zeros); ``model``.

    Then ``model.load_state_dict(slimmed_state)`` fills them. A name that is no
    tensor or module of ``model`` raises ``KeyError`` before anything changes.
    Tied tensors stay tied.
    """
    tensors = shapes.get("tensors", {})
    attributes = shapes.get("attributes", {})
    holders = dict([*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)])
    modules = dict(model.named_modules(remove_duplicate=False))
    missing = [name for name in tensors if name not in holders] + [name for name in attributes if name not in modules]
    if missing:
        raise KeyError(f"the slimmed shapes name {missing[0]!r}, which this model does not have")
    replaced: dict[int, torch.Tensor] = {}
    for name, shape in tensors.items():
        old = holders[name]
        new = replaced.get(id(old))
        if new is None:
            data = torch.zeros(shape, dtype=old.dtype, device=old.device)
            new = nn.Parameter(data, requires_grad=old.requires_grad) if isinstance(old, nn.Parameter) else data
            replaced[id(old)] = new
    for module in model.modules():  # every holder of a replaced tensor, tied ones included
        for store in (module._parameters, module._buffers):
            for key, tensor in list(store.items()):
                if tensor is not None and id(tensor) in replaced:
                    store[key] = replaced[id(tensor)]  # type: ignore[assignment]
    for module_name, values in attributes.items():
        module = modules[module_name]
        for key, value in values.items():
            setattr(module, key, tuple(value) if isinstance(value, list) else value)
    model.__dict__[_ATTRIBUTE] = {"tensors": dict(tensors), "attributes": {k: dict(v) for k, v in attributes.items()}}
    return model
