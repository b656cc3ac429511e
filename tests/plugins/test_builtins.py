"""The built-in methods, reached by name through the plugin registry, on every device."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import prunereg
import prunereg.prune as prune

BUILTINS = {
    "identity": (prune.Identity, {}),
    "random_unstructured": (prune.RandomUnstructured, {"amount": 0.4}),
    "l1_unstructured": (prune.L1Unstructured, {"amount": 0.4}),
    "random_structured": (prune.RandomStructured, {"amount": 1, "dim": 1}),
    "ln_structured": (prune.LnStructured, {"amount": 1, "n": 2, "dim": 0}),
    "custom_from_mask": (prune.CustomFromMask, {"mask": torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])}),
}


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_get_returns_the_drop_in_class(name):
    cls, _ = BUILTINS[name]
    assert prunereg.get(name) is cls
    assert name in prunereg.list_methods()
    assert prunereg.info(name).kind == cls.PRUNING_TYPE


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_every_builtin_prunes_on_every_device(name, dtype, device):
    _, kwargs = BUILTINS[name]
    module = nn.Linear(3, 2, device=device, dtype=dtype)
    prunereg.get(name).apply(module, "weight", **kwargs)
    mask = module.weight_mask
    assert (mask.shape, mask.dtype, mask.device) == (module.weight_orig.shape, dtype, module.weight_orig.device)
    assert module.weight.device == module.weight_orig.device
    if device != "meta":
        assert set(mask.unique().tolist()) <= {0.0, 1.0}


def test_identity_prunes_nothing():
    module = nn.Linear(3, 2)
    prune.identity(module, "weight")
    assert torch.equal(module.weight_mask, torch.ones(2, 3))


@pytest.mark.parametrize("amount, expected", [(0, 0), (1, 1), (5, 5), (0.0, 0), (0.5, 6), (1.0, 12)])
def test_l1_unstructured_prunes_exactly_k_smallest(amount, expected):
    values = torch.tensor([[3.0, -1.0, 7.0, 0.5], [-9.0, 2.0, 8.0, -4.0], [6.0, -5.0, 10.0, 11.0]])
    module = nn.Module()
    module.w = nn.Parameter(values.clone())
    prune.l1_unstructured(module, "w", amount=amount)
    pruned = module.w_mask == 0
    assert int(pruned.sum()) == expected
    if 0 < expected < values.numel():
        assert values.abs()[pruned].max() < values.abs()[~pruned].min()


def test_l1_unstructured_prunes_exactly_k_also_with_ties():
    module = nn.Module()
    module.w = nn.Parameter(torch.tensor([1.0, 2.0, 2.0, 2.0, 3.0]))
    prune.l1_unstructured(module, "w", amount=2)
    assert torch.equal(module.w_mask[[0, 4]], torch.tensor([0.0, 1.0]))
    assert int((module.w_mask == 0).sum()) == 2


def test_l1_unstructured_prunes_nan_first():
    module = nn.Module()
    module.w = nn.Parameter(torch.tensor([1.0, math.nan, -3.0, 0.5, math.nan]))
    prune.l1_unstructured(module, "w", amount=3)
    assert torch.equal(module.w_mask, torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0]))


def test_random_unstructured_follows_the_seed():
    masks = []
    for _ in range(2):
        torch.manual_seed(7)
        module = nn.Linear(10, 10)
        prune.random_unstructured(module, "weight", amount=0.3)
        masks.append(module.weight_mask)
    assert torch.equal(masks[0], masks[1])
    assert int((masks[0] == 0).sum()) == 30


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_random_structured_prunes_whole_channels(dim):
    module = nn.Conv2d(4, 5, 3)  # weight (5, 4, 3, 3)
    prune.random_structured(module, "weight", amount=2, dim=dim)
    other = [d for d in range(4) if d != dim % 4]
    zeros = (module.weight_mask == 0).sum(dim=other)
    size = module.weight.numel() // module.weight.shape[dim]
    assert sorted(zeros.tolist()) == [0] * (module.weight.shape[dim] - 2) + [size] * 2


@pytest.mark.parametrize("n", [1, 2, math.inf, -math.inf, "fro"])
def test_ln_structured_prunes_the_channels_of_lowest_norm(n):
    module = nn.Linear(3, 4, bias=False)
    with torch.no_grad():
        module.weight.copy_(torch.tensor([[4.0, 4, 4], [1, 1, 1], [3, 3, 3], [2, 2, 2]]))
    prune.ln_structured(module, "weight", amount=2, n=n, dim=0)
    assert torch.equal(module.weight_mask[:, 0], torch.tensor([1.0, 0.0, 1.0, 0.0]))


def test_ln_structured_prunes_nan_channels_first():
    module = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        module.weight.copy_(torch.tensor([[1.0, 1.0], [math.nan, 5.0], [3.0, 3.0]]))
    prune.ln_structured(module, "weight", amount=1, n=2, dim=0)
    assert torch.equal(module.weight_mask[:, 0], torch.tensor([1.0, 0.0, 1.0]))


@pytest.mark.parametrize("builtin", ["random_structured", "ln_structured"])
def test_structured_methods_need_two_dims(builtin):
    cls, kwargs = BUILTINS[builtin]
    with pytest.raises(ValueError, match="multidimensional"):
        cls.apply(nn.Linear(3, 2), "bias", **{**kwargs, "dim": 0})


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float16, torch.float64])
def test_custom_from_mask_accepts_any_dtype_and_device(mask_dtype, device):
    module = nn.Linear(3, 2, device=device)
    mask = torch.tensor([[1, 0, 1], [0, 1, 1]]).to(mask_dtype)  # on the CPU
    prune.custom_from_mask(module, "weight", mask)
    assert module.weight_mask.dtype == module.weight.dtype
    assert module.weight_mask.device == module.weight_orig.device
    if device != "meta":
        assert torch.equal(module.weight_mask.cpu(), mask.to(torch.float32))


def test_custom_from_mask_of_another_shape_is_an_assertion_error():
    module = nn.Linear(3, 2)
    with pytest.raises(AssertionError, match="must match"):
        prune.custom_from_mask(module, "weight", torch.ones(3, 2))
    assert not prunereg.is_pruned(module)


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_functional_forms_return_the_module(name):
    function = getattr(prune, name)
    _, kwargs = BUILTINS[name]
    module = nn.Linear(3, 2)
    assert function(module, "weight", **kwargs) is module
