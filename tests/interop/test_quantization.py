"""quantize_dynamic of a pruned model: the quantized weights carry the zeros."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg
import prunereg.prune as prune

# quantize_dynamic is deprecated in favour of torchao, yet still what many users call.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


def net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def quantize(model: nn.Module) -> nn.Module:
    return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def pruned() -> nn.Sequential:
    model = net()
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    prune.ln_structured(model[2], "weight", amount=2, n=2, dim=0)
    return model


def test_torch_fails():
    model = net()
    torch_prune.l1_unstructured(model[0], "weight", amount=0.5)
    with pytest.raises(RuntimeError):
        quantize(model)


def test_quantized_weights_carry_the_zeros():
    model = pruned()
    masks = [model[0].weight_mask.clone(), model[2].weight_mask.clone()]
    quantized = quantize(model)
    for module, mask in zip((quantized[0], quantized[2]), masks):
        assert bool((module.weight().dequantize()[mask == 0] == 0).all())
    assert prunereg.is_pruned(model)  # the float model is untouched


def test_quantized_output_equals_quantizing_the_removed_model():
    model = pruned()
    removed = pruned()
    prunereg.remove(removed[0], "weight")
    prunereg.remove(removed[2], "weight")
    x = torch.randn(8, 16)
    torch.testing.assert_close(quantize(model)(x), quantize(removed)(x))


def test_quantized_in_place():
    model = pruned()
    expected = quantize(pruned())(torch.ones(2, 16))
    torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    torch.testing.assert_close(model(torch.ones(2, 16)), expected)
