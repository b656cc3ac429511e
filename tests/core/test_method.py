"""The BasePruningMethod contract: compute_mask, prune, apply, apply_mask, remove."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import prunereg
from prunereg import BasePruningMethod
from prunereg.prune import L1Unstructured


class KeepPositive(BasePruningMethod):
    """A third-party style method: prune every entry that is not positive."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t, default_mask):
        return default_mask * (t > 0).to(default_mask.dtype)


def test_compute_mask_is_abstract():
    class NoMask(BasePruningMethod):
        PRUNING_TYPE = "unstructured"

    with pytest.raises(TypeError):
        NoMask()


def test_prune_returns_masked_copy_and_leaves_input_alone():
    t = torch.tensor([[-1.0, 2.0], [3.0, -4.0]])
    before = t.clone()
    assert torch.equal(KeepPositive().prune(t), torch.tensor([[0.0, 2.0], [3.0, 0.0]]))
    assert torch.equal(t, before)


def test_prune_respects_default_mask_and_importance_scores():
    t = torch.tensor([1.0, 2.0, 3.0, 4.0])
    scores = torch.tensor([2.0, 1.0, 3.0, 4.0])
    default_mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    pruned = L1Unstructured(amount=1).prune(t, default_mask=default_mask, importance_scores=scores)
    # The default mask's zero stays; the lowest score (index 1, not |t|'s index 0) goes.
    assert torch.equal(pruned, torch.tensor([1.0, 0.0, 3.0, 0.0]))


def test_prune_rejects_scores_of_another_shape():
    with pytest.raises(AssertionError, match="same shape"):
        L1Unstructured(amount=1).prune(torch.ones(4), importance_scores=torch.ones(2, 2))


def test_prune_accepts_scores_on_another_device(device):
    t = torch.arange(1.0, 5.0, device=device)
    pruned = L1Unstructured(amount=2).prune(t, importance_scores=torch.tensor([4.0, 3.0, 2.0, 1.0]))
    assert pruned.device == t.device
    if device != "meta":
        assert torch.equal(pruned.cpu(), torch.tensor([1.0, 2.0, 0.0, 0.0]))


def test_apply_of_a_custom_method_reparametrizes(device):
    module = nn.Linear(2, 2, device=device)
    weight = module.weight
    hook = KeepPositive.apply(module, "weight")
    assert isinstance(hook, KeepPositive) and hook._tensor_name == "weight"
    assert module.weight_orig is weight
    assert module.weight_mask.shape == weight.shape and module.weight_mask.device == weight.device
    assert list(module._forward_pre_hooks.values()) == [hook]
    if device != "meta":
        assert torch.equal(module.weight, weight * (weight > 0))


def test_apply_passes_arguments_to_the_constructor():
    module = nn.Linear(4, 1, bias=False)
    hook = L1Unstructured.apply(module, "weight", 3)
    assert hook.amount == 3
    assert int((module.weight_mask == 0).sum()) == 3


def test_apply_mask_multiplies_in_the_original_dtype():
    module = nn.Linear(2, 2).double()
    hook = KeepPositive.apply(module, "weight")
    module.weight_mask = module.weight_mask.to(torch.float16)
    assert hook.apply_mask(module).dtype == torch.float64


def test_apply_mask_and_remove_need_a_tensor_name():
    method = KeepPositive()
    method._tensor_name = None
    with pytest.raises(AssertionError):
        method.apply_mask(nn.Linear(2, 2))
    with pytest.raises(AssertionError):
        method.remove(nn.Linear(2, 2))


def test_forward_recomputes_the_pruned_tensor():
    module = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        module.weight.copy_(torch.tensor([[1.0, -1.0]]))
    KeepPositive.apply(module, "weight")
    with torch.no_grad():  # an optimizer step: module.weight is stale until the next forward
        module.weight_orig.copy_(torch.tensor([[5.0, 7.0]]))
    out = module(torch.ones(1, 2))
    assert torch.equal(module.weight, torch.tensor([[5.0, 0.0]]))
    assert torch.equal(out, torch.tensor([[5.0]]))


def test_method_remove_makes_pruning_permanent():
    module = nn.Linear(2, 2)
    hook = KeepPositive.apply(module, "weight")
    pruned = module.weight.detach().clone()
    hook.remove(module)
    assert isinstance(module.weight, nn.Parameter)
    assert torch.equal(module.weight, pruned)
    assert not hasattr(module, "weight_orig") and not hasattr(module, "weight_mask")


def test_third_party_method_combines_with_builtins_in_a_container():
    module = nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        module.weight.copy_(torch.tensor([[-1.0, 2.0, 3.0, 4.0]]))
    KeepPositive.apply(module, "weight")
    L1Unstructured.apply(module, "weight", amount=1)
    hook = next(iter(module._forward_pre_hooks.values()))
    assert isinstance(hook, prunereg.PruningContainer)
    assert [type(m) for m in hook] == [KeepPositive, L1Unstructured]
    # L1 acted only on what KeepPositive left: 2 is now the smallest entry left.
    assert torch.equal(module.weight_mask, torch.tensor([[0.0, 0.0, 1.0, 1.0]]))


class ReturnsMask(BasePruningMethod):
    """A faulty method: its mask is whatever it was given, not one fitted to the tensor."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, mask):
        self.mask = mask

    def compute_mask(self, t, default_mask):
        return self.mask


def module_state(module: nn.Module) -> tuple:
    return (
        dict(module._parameters),
        dict(module._buffers),
        dict(module._forward_pre_hooks),
        dict(module.__dict__),
    )


@pytest.mark.parametrize(
    "mask",
    [torch.ones(1, 3), torch.ones(3), torch.ones(2, 3, device="meta")],
    ids=["broadcasting-row", "broadcasting-vector", "meta-for-cpu"],
)
@pytest.mark.parametrize("pruned_before", [False, True], ids=["first", "on-top"])
def test_apply_refuses_a_mask_of_another_shape_or_device(mask, pruned_before):
    linear = nn.Linear(3, 2)
    if pruned_before:
        L1Unstructured.apply(linear, "weight", amount=2)
    before = module_state(linear)
    with pytest.raises(RuntimeError, match="compute_mask returned a mask"):
        ReturnsMask.apply(linear, "weight", mask=mask)
    after = module_state(linear)
    assert all(a.keys() == b.keys() and all(a[k] is b[k] for k in a) for a, b in zip(before, after))
