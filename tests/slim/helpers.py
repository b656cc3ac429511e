"""Helpers the slimming tests share: exact snapshots of a model, to prove a refusal changed nothing; odd models."""

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


def bitwise(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the state dict, to compare bit for bit with :func:`assert_bitwise_equal`."""
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_bitwise_equal(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert after[name].dtype == tensor.dtype and after[name].shape == tensor.shape, name
        assert torch.equal(after[name].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), name


class DataDependentBranch(nn.Module):
    """A model ``torch.export`` cannot trace: which branch runs depends on the values, and one holds a layer of its own.

    (A branch on values whose every layer ran is followed by slimming's eager capture; this one goes to export.)
    """

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fallback = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.fallback(x) if h.isnan().any() else h


def outputs(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    with torch.no_grad():
        out = model(*inputs)
    return out.logits if hasattr(out, "logits") else out


class AttentionResidual(nn.Module):
    """nn.MultiheadAttention on a projected stream with a residual add: its width is the stream's."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 16)
        self.attention = nn.MultiheadAttention(16, 4, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.head(h + self.attention(h, h, h, need_weights=False)[0])


class DataDependentShape(nn.Module):
    """A shape made from the values (a boolean index): refused by name, through torch.export."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h[h > 0]
