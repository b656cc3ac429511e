"""Writing solved values into a block's parameters, and finding the mask a parameter keeps."""

from __future__ import annotations

import torch
from torch import nn

from prunereg import RecoveryBlock


def write(parameter: torch.Tensor, values: torch.Tensor) -> None:
    """Copy ``values`` into ``parameter`` in place, in its dtype and on its device."""
    with torch.no_grad():
        parameter.copy_(values.to(device=parameter.device, dtype=parameter.dtype))


def kept_entries(block: RecoveryBlock, parameter: torch.Tensor) -> torch.Tensor | None:
    """The mask of ``parameter`` (a parameter of ``block.module``) on a masked model, None where nothing is pruned."""
    for name, candidate in block.module.named_parameters():
        if candidate is parameter:
            return block.masks.get(name)
    return None


def linear_weight(layer: nn.Module) -> nn.Parameter:
    """An ``nn.Linear``'s weight parameter (``[out, in]``)."""
    weight = layer.weight
    assert isinstance(weight, nn.Parameter)
    return weight


def linear_bias(layer: nn.Module) -> nn.Parameter | None:
    """An ``nn.Linear``'s bias parameter (``[out]``), None where it has none."""
    bias = layer.bias
    assert bias is None or isinstance(bias, nn.Parameter)
    return bias
