"""global_unstructured: one ranking over many tensors, without keeping them concatenated."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg
from prunereg.prune import (
    CustomFromMask,
    L1Unstructured,
    LnStructured,
    PruningContainer,
    RandomUnstructured,
    global_unstructured,
    l1_unstructured,
)


def two_layers(device: str = "cpu", dtype: torch.dtype = torch.float32) -> tuple[nn.Linear, nn.Linear]:
    first, second = nn.Linear(4, 2, device=device, dtype=dtype), nn.Linear(3, 1, device=device, dtype=dtype)
    if device != "meta":
        with torch.no_grad():
            first.weight.copy_(torch.tensor([[1.0, 2, 3, 4], [-4, -3, -2, -1]]))
            second.weight.copy_(torch.tensor([[0.0, 0.1, -2]]))
    return first, second


def test_prunes_the_smallest_entries_across_tensors():
    first, second = two_layers()
    global_unstructured([(first, "weight"), (second, "weight")], L1Unstructured, amount=4)
    assert torch.equal(first.weight_mask, torch.tensor([[0.0, 1, 1, 1], [1, 1, 1, 0]]))
    assert torch.equal(second.weight_mask, torch.tensor([[0.0, 0, 1]]))
    assert isinstance(next(iter(first._forward_pre_hooks.values())), CustomFromMask)


@pytest.mark.parametrize("container", [list, tuple, iter, lambda pairs: (p for p in pairs)])
def test_parameters_may_be_any_iterable(container):
    first, second = two_layers()
    global_unstructured(container([(first, "weight"), (second, "weight")]), L1Unstructured, amount=4)
    assert int((first.weight_mask == 0).sum() + (second.weight_mask == 0).sum()) == 4


@pytest.mark.parametrize("method", [L1Unstructured, RandomUnstructured])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_masks_take_each_tensors_shape_dtype_and_device(method, dtype, device):
    first, second = two_layers(device, dtype)
    pairs = [(first, "weight"), (first, "bias"), (second, "weight")]
    global_unstructured(pairs, method, amount=5)
    for module, name in pairs:
        mask, orig = getattr(module, name + "_mask"), getattr(module, name + "_orig")
        assert (mask.shape, mask.dtype, mask.device) == (orig.shape, orig.dtype, orig.device)
    if device != "meta":
        assert sum(int((getattr(m, n + "_mask") == 0).sum()) for m, n in pairs) == 5


def test_tensors_of_different_dtypes_get_their_own_mask_dtype():
    first, second = nn.Linear(3, 2).double(), nn.Linear(3, 2).half()
    global_unstructured([(first, "weight"), (second, "weight")], L1Unstructured, amount=0.5)
    assert first.weight_mask.dtype == torch.float64 and second.weight_mask.dtype == torch.float16
    assert int((first.weight_mask == 0).sum() + (second.weight_mask == 0).sum()) == 6


def test_each_mask_owns_storage_of_its_own_size():
    first, second = two_layers()
    global_unstructured([(first, "weight"), (second, "weight")], L1Unstructured, amount=4)
    for module in (first, second):
        mask = module.weight_mask
        assert mask.untyped_storage().nbytes() == mask.numel() * mask.element_size()
        hook = next(iter(module._forward_pre_hooks.values()))
        assert hook.mask.untyped_storage().nbytes() == mask.numel() * mask.element_size()
    assert first.weight_mask.untyped_storage().data_ptr() != second.weight_mask.untyped_storage().data_ptr()


def test_importance_scores_rank_instead_of_the_weights():
    first, second = two_layers()
    scores = {
        (first, "weight"): torch.tensor([[4.0, 2, 1, 3], [-3, -1, -2, -4]]),
        (second, "weight"): torch.tensor([[0.0, 10, -0.2]]),
    }
    global_unstructured([(first, "weight"), (second, "weight")], L1Unstructured, importance_scores=scores, amount=4)
    assert torch.equal(first.weight_mask, torch.tensor([[1.0, 1, 0, 1], [1, 0, 1, 1]]))
    assert torch.equal(second.weight_mask, torch.tensor([[0.0, 1, 0]]))


def test_importance_scores_may_be_flat_like_in_torch():
    first, second = two_layers()
    flat = {(first, "weight"): torch.tensor([4.0, 2, 1, 3, -3, -1, -2, -4])}
    global_unstructured([(first, "weight"), (second, "weight")], L1Unstructured, importance_scores=flat, amount=2)
    assert torch.equal(first.weight_mask, torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 1]]))
    assert torch.equal(second.weight_mask, torch.tensor([[0.0, 0, 1]]))


def test_importance_scores_of_another_size_are_an_index_error():
    first, second = two_layers()
    before = first.weight
    with pytest.raises(IndexError, match="8 entries"):
        global_unstructured(
            [(first, "weight"), (second, "weight")],
            L1Unstructured,
            importance_scores={(first, "weight"): torch.ones(9)},
            amount=2,
        )
    assert first.weight is before and not prunereg.is_pruned(first) and not prunereg.is_pruned(second)


def test_importance_scores_on_another_device_and_dtype(device):
    first, second = two_layers(device)
    scores = {(first, "weight"): torch.arange(8, dtype=torch.float64).reshape(2, 4)}
    global_unstructured([(first, "weight"), (second, "weight")], L1Unstructured, importance_scores=scores, amount=3)
    assert first.weight_mask.device == first.weight_orig.device
    assert first.weight_mask.dtype == torch.float32
    if device != "meta":
        # The first tensor's score 0, and the second tensor's 0 and 0.1.
        assert torch.equal(first.weight_mask.cpu(), torch.tensor([[0.0, 1, 1, 1], [1, 1, 1, 1]]))
        assert torch.equal(second.weight_mask.cpu(), torch.tensor([[0.0, 0, 1]]))


def test_already_pruned_tensors_keep_their_zeros_and_gain_a_container():
    first, second = two_layers()
    l1_unstructured(first, "weight", amount=1)  # prunes the 1
    global_unstructured([(first, "weight"), (second, "weight")], L1Unstructured, amount=3)
    # Of what is left, 0, 0.1 and -1 are the smallest.
    assert torch.equal(first.weight_mask, torch.tensor([[0.0, 1, 1, 1], [1, 1, 1, 0]]))
    assert torch.equal(second.weight_mask, torch.tensor([[0.0, 0, 1]]))
    hook = next(iter(first._forward_pre_hooks.values()))
    assert isinstance(hook, PruningContainer)
    assert [type(m) for m in hook] == [L1Unstructured, CustomFromMask]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second real device")
def test_tensors_on_different_devices():
    first, second = two_layers()
    second.cuda()
    global_unstructured([(first, "weight"), (second, "weight")], L1Unstructured, amount=4)
    assert second.weight_mask.is_cuda and not first.weight_mask.is_cuda
    assert torch.equal(second.weight_mask.cpu(), torch.tensor([[0.0, 0, 1]]))


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda m: global_unstructured([], L1Unstructured, amount=0.5), ValueError),
        (lambda m: global_unstructured(3, L1Unstructured, amount=1), TypeError),
        (lambda m: global_unstructured([(m, "weight")], L1Unstructured, importance_scores=[], amount=1), TypeError),
        (lambda m: global_unstructured([(m, "weight")], prunereg.prune.l1_unstructured, amount=1), TypeError),
        (lambda m: global_unstructured([(m, "weight")], LnStructured, amount=1, n=2, dim=0), TypeError),
        (lambda m: global_unstructured([(m, "weight")], L1Unstructured, amount=9), ValueError),
        (lambda m: global_unstructured([(m, "weight")], L1Unstructured, amount=-1), ValueError),
        (lambda m: global_unstructured([(m, "nope")], L1Unstructured, amount=1), AttributeError),
    ],
    ids=["empty", "not-iterable", "scores-not-dict", "function", "structured", "too-many", "negative", "no-such-name"],
)
def test_bad_input_raises_and_changes_nothing(call, error):
    module = nn.Linear(4, 2)
    weight = module.weight
    with pytest.raises(error):
        call(module)
    assert module.weight is weight and not module._forward_pre_hooks and not module._buffers


def test_a_tensor_listed_twice_keeps_the_zeros_of_both_shares():
    masks = []
    for p in (torch_prune, prunereg.prune):
        torch.manual_seed(0)
        module = nn.Linear(4, 2)
        torch.manual_seed(1)
        p.global_unstructured([(module, "weight"), (module, "weight")], p.RandomUnstructured, amount=8)
        masks.append(module.weight_mask)
    assert torch.equal(masks[1], masks[0])
