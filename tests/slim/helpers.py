"""Helpers the slimming tests share: exact snapshots of a model, to prove a refusal changed nothing."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def exact_state(model: nn.Module) -> dict[str, Any]:
    """Every tensor (object identity and values) and every module's attributes, to compare before and after."""
    tensors = {
        name: (id(tensor), tensor.detach().clone())
        for name, tensor in [
            *model.named_parameters(remove_duplicate=False),
            *model.named_buffers(remove_duplicate=False),
        ]
    }
    attributes = {
        name: {
            key: value
            for key, value in vars(module).items()
            if not key.startswith("_") and not isinstance(value, torch.Tensor)
        }
        for name, module in model.named_modules(remove_duplicate=False)
    }
    plain = {
        f"{name}.{key}": id(value)
        for name, module in model.named_modules(remove_duplicate=False)
        for key, value in vars(module).items()
        if isinstance(value, torch.Tensor)
    }
    config = getattr(model, "config", None)
    return {
        "plain": plain,
        "tensors": tensors,
        "attributes": repr(attributes),
        "config": repr(getattr(config, "__dict__", None)),
    }


def assert_unchanged(model: nn.Module, before: dict[str, Any]) -> None:
    after = exact_state(model)
    assert after["tensors"].keys() == before["tensors"].keys()
    for name, (identity, value) in before["tensors"].items():
        assert after["tensors"][name][0] == identity, name
        torch.testing.assert_close(after["tensors"][name][1], value, rtol=0, atol=0)
    assert after["attributes"] == before["attributes"]
    assert after["plain"] == before["plain"]  # tensors a pruning hook keeps as plain attributes
    assert after["config"] == before["config"]


def outputs(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    with torch.no_grad():
        out = model(*inputs)
    return out.logits if hasattr(out, "logits") else out
