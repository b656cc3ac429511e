"""Where prunereg deliberately does better than torch.nn.utils.prune.

Each test checks prunereg's behaviour and, where cheap, that torch fails on
the same input, so the test documents the difference (and notices the day
torch fixes it).
"""

from __future__ import annotations

import copy
import io
import math
import pickle

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg
import prunereg.prune as prune


def pruned_model(p=prune) -> nn.Sequential:
    """A small model pruned every way: unstructured then structured, and globally."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    p.l1_unstructured(model[0], "weight", amount=0.5)
    p.ln_structured(model[0], "weight", amount=1, n=2, dim=0)
    p.global_unstructured([(model[0], "bias"), (model[2], "weight")], p.L1Unstructured, amount=3)
    return model


def train_step(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(x).square().sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


# --- deepcopy (pytorch#37322) -------------------------------------------------------------------


def test_deepcopy_of_a_pruned_model():
    with pytest.raises(RuntimeError, match="deepcopy"):
        copy.deepcopy(pruned_model(torch_prune))

    model = pruned_model()
    x = torch.randn(5, 4)
    copied = copy.deepcopy(model)
    copy_of_copy = copy.deepcopy(copied)
    for other in (copied, copy_of_copy):
        assert torch.equal(other(x), model(x))
        assert other[0].weight_orig is not model[0].weight_orig
        assert other[0].weight_mask.data_ptr() != model[0].weight_mask.data_ptr()
        assert list(other.state_dict()) == list(model.state_dict())


def test_a_deepcopy_trains_on_its_own_parameters():
    model = pruned_model()
    copied = copy.deepcopy(model)
    x = torch.randn(5, 4)
    # Before any forward, the copy's pruned tensor already leads to the copy's parameter.
    copied[0].weight.sum().backward()
    assert torch.equal(copied[0].weight_orig.grad, copied[0].weight_mask)
    assert model[0].weight_orig.grad is None
    grads = train_step(copied, x)
    for name, grad in train_step(model, x).items():
        assert torch.equal(grads[name], grad)
    with torch.no_grad():
        copied[0].weight_orig.add_(1.0)
    assert not torch.equal(copied(x), model(x))
    assert torch.equal((copied[0].weight == 0), (model[0].weight == 0))


# --- torch.load(weights_only=True) of a whole pruned model ---------------------------------------


def saved(model: nn.Module) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return buffer


MODEL_CLASSES = [nn.Sequential, nn.Linear, nn.ReLU]


def test_a_whole_pruned_model_loads_with_weights_only():
    with torch.serialization.safe_globals(MODEL_CLASSES), pytest.raises(pickle.UnpicklingError):
        torch.load(saved(pruned_model(torch_prune)), weights_only=True)

    model = pruned_model()
    with pytest.raises(pickle.UnpicklingError):  # the pruning classes must be allowed explicitly
        torch.load(saved(model), weights_only=True)
    with prunereg.safe_globals(*MODEL_CLASSES):
        loaded = torch.load(saved(model), weights_only=True)
    x = torch.randn(5, 4)
    assert torch.equal(loaded(x), model(x))
    assert list(loaded.state_dict()) == list(model.state_dict())
    assert train_step(loaded, x).keys() == train_step(model, x).keys()


# --- masks and scores on another device or dtype ------------------------------------------------

OTHER_DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", OTHER_DEVICES)
def test_custom_from_mask_with_a_mask_on_another_device(device):
    mask = torch.tensor([[True, False, True], [False, True, True]])  # on the CPU, bool
    with pytest.raises(RuntimeError):
        torch_prune.custom_from_mask(nn.Linear(3, 2, device=device), "weight", mask)

    module = nn.Linear(3, 2, device=device)
    prune.custom_from_mask(module, "weight", mask)
    assert module.weight_mask.device == module.weight_orig.device
    assert module.weight_mask.dtype == module.weight_orig.dtype
    if device != "meta":
        assert torch.equal(module.weight_mask.cpu(), mask.float())


@pytest.mark.parametrize("device", OTHER_DEVICES)
def test_importance_scores_on_another_device_and_dtype(device):
    scores = torch.tensor([[1.0, 2.0, 3.0], [9.0, 8.0, 7.0]], dtype=torch.float64)  # on the CPU
    with pytest.raises(RuntimeError):
        torch_prune.ln_structured(nn.Linear(3, 2, device=device), "weight", 1, 2, 0, importance_scores=scores)

    module = nn.Linear(3, 2, device=device)
    prune.ln_structured(module, "weight", 1, 2, 0, importance_scores=scores)
    prune.l1_unstructured(module, "weight", 2, importance_scores=scores)
    assert module.weight_mask.device == module.weight_orig.device
    if device != "meta":
        # Row 0 has the lower norm; then the two lowest scores left, 7 and 8.
        assert torch.equal(module.weight_mask.cpu(), torch.tensor([[0.0, 0, 0], [1, 0, 0]], dtype=torch.float64))


# --- global_unstructured: meta, generators, no concatenation kept ---------------------------------


def test_global_pruning_on_meta():
    with pytest.raises(NotImplementedError):
        torch_prune.global_unstructured(
            [(nn.Linear(3, 2, device="meta"), "weight")], torch_prune.L1Unstructured, amount=2
        )

    first, second = nn.Linear(3, 2, device="meta"), nn.Linear(2, 2, device="meta", dtype=torch.float16)
    prune.global_unstructured([(first, "weight"), (second, "weight")], prune.L1Unstructured, amount=4)
    assert first.weight_mask.is_meta and first.weight_mask.shape == (2, 3)
    assert second.weight_mask.dtype == torch.float16


def test_global_pruning_accepts_a_generator():
    torch_modules = [nn.Linear(3, 2), nn.Linear(3, 2)]
    with pytest.raises(ValueError):
        torch_prune.global_unstructured(((m, "weight") for m in torch_modules), torch_prune.L1Unstructured, amount=4)

    modules = [nn.Linear(3, 2), nn.Linear(3, 2)]
    prune.global_unstructured(((m, "weight") for m in modules), prune.L1Unstructured, amount=4)
    assert sum(int((m.weight_mask == 0).sum()) for m in modules) == 4


def storage_sizes(module: nn.Module) -> set[int]:
    """Bytes of the storage behind every tensor the pruning of ``module.weight`` keeps."""
    hook = next(iter(module._forward_pre_hooks.values()))
    methods = getattr(hook, "_pruning_methods", (hook,))
    tensors = [module.weight_mask] + [
        m.mask for m in methods if isinstance(m, torch_prune.CustomFromMask | prune.CustomFromMask)
    ]
    return {t.untyped_storage().nbytes() for t in tensors}


@pytest.mark.parametrize("already_pruned", [False, True])
def test_global_pruning_keeps_no_concatenated_mask_alive(already_pruned):
    sizes = []
    for p in (torch_prune, prune):
        modules = [nn.Linear(8, 4), nn.Linear(4, 2)]
        if already_pruned:
            p.l1_unstructured(modules[0], "weight", amount=3)
        p.global_unstructured([(m, "weight") for m in modules], p.L1Unstructured, amount=0.5)
        sizes.append([storage_sizes(m) for m in modules])
    torch_sizes, our_sizes = sizes
    total = (32 + 8) * 4
    assert total in torch_sizes[0] and total in torch_sizes[1]  # every hook keeps the concatenation
    assert our_sizes == [{32 * 4}, {8 * 4}]


# --- non-contiguous and channels_last parameters --------------------------------------------------

LAYOUT_PRUNINGS = {
    "l1_unstructured": lambda p, m: p.l1_unstructured(m, "weight", amount=0.4),
    "random_unstructured": lambda p, m: p.random_unstructured(m, "weight", amount=0.4),
    "ln_structured": lambda p, m: p.ln_structured(m, "weight", amount=2, n=1, dim=1),
    "random_structured": lambda p, m: p.random_structured(m, "weight", amount=1, dim=0),
    "global": lambda p, m: p.global_unstructured([(m, "weight"), (m, "bias")], p.L1Unstructured, amount=20),
    "mixed": lambda p, m: (
        p.l1_unstructured(m, "weight", amount=0.3),
        p.ln_structured(m, "weight", amount=1, n=2, dim=0),
        p.global_unstructured([(m, "weight"), (m, "bias")], p.RandomUnstructured, amount=9),
    ),
}


def conv_pair() -> tuple[nn.Conv2d, nn.Conv2d]:
    torch.manual_seed(3)
    contiguous = nn.Conv2d(3, 4, 3)
    return contiguous, copy.deepcopy(contiguous).to(memory_format=torch.channels_last)


def transposed_pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(3)
    values, bias = torch.randn(5, 6), torch.randn(6)
    pair = []
    for weight in (values.t().contiguous(), values.t()):
        module = nn.Module()
        module.weight = nn.Parameter(weight.clone() if weight.is_contiguous() else weight)
        module.bias = nn.Parameter(bias.clone())
        pair.append(module)
    assert not pair[1].weight.is_contiguous()
    return pair[0], pair[1]


@pytest.mark.parametrize("make_pair", [conv_pair, transposed_pair], ids=["channels_last", "transposed"])
@pytest.mark.parametrize("pruning", sorted(LAYOUT_PRUNINGS))
def test_non_contiguous_parameters_prune_like_contiguous_ones(make_pair, pruning):
    act = LAYOUT_PRUNINGS[pruning]
    contiguous, strided = make_pair()
    torch.manual_seed(5)
    act(prune, contiguous)
    torch.manual_seed(5)
    act(prune, strided)
    assert torch.equal(strided.weight_mask, contiguous.weight_mask)
    assert torch.equal(strided.weight, contiguous.weight)
    prune.remove(strided, "weight")
    assert torch.equal(strided.weight, contiguous.weight)


@pytest.mark.parametrize("make_pair", [conv_pair, transposed_pair], ids=["channels_last", "transposed"])
def test_torch_fails_on_non_contiguous_parameters(make_pair):
    _, strided = make_pair()
    with pytest.raises(RuntimeError, match="view"):
        torch_prune.l1_unstructured(strided, "weight", amount=0.4)


def test_channels_last_conv_runs_pruned():
    contiguous, channels_last = conv_pair()
    for module in (contiguous, channels_last):
        prune.l1_unstructured(module, "weight", amount=0.5)
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(channels_last(x.to(memory_format=torch.channels_last)), contiguous(x))


# --- a failed re-prune leaves the earlier pruning intact ------------------------------------------


@pytest.mark.parametrize(
    "bad_prune",
    [
        lambda p, m: p.l1_unstructured(m, "weight", amount=9),
        lambda p, m: p.l1_unstructured(m, "weight", amount=-1),
        lambda p, m: p.l1_unstructured(m, "weight", amount=1, importance_scores=torch.ones(5)),
        lambda p, m: p.ln_structured(m, "weight", amount=1, n=2, dim=4),
    ],
    ids=["amount too large", "bad amount", "scores of another shape", "bad dim"],
)
def test_a_failed_reprune_keeps_the_earlier_pruning(bad_prune):
    torch_module = nn.Linear(3, 2)
    torch_prune.l1_unstructured(torch_module, "weight", amount=2)
    with pytest.raises((ValueError, AssertionError, IndexError)):
        bad_prune(torch_prune, torch_module)
    assert not torch_prune.is_pruned(torch_module) and hasattr(torch_module, "weight_orig")  # torch lies

    module = nn.Linear(3, 2)
    prune.l1_unstructured(module, "weight", amount=2)
    mask = module.weight_mask
    with pytest.raises((ValueError, AssertionError, IndexError)):
        bad_prune(prune, module)
    assert prunereg.is_pruned(module)
    assert module.weight_mask is mask and len(module._forward_pre_hooks) == 1
    with torch.no_grad():
        module.weight_orig.fill_(1.0)
    module(torch.ones(1, 3))
    assert torch.equal(module.weight, mask)  # the hook still recomputes the pruned weight


# --- remove keeps the parameter's place ----------------------------------------------------------


@pytest.mark.parametrize("p", [torch_prune, prune], ids=["torch", "prunereg"])
def test_remove_keeps_the_parameters_place(p):
    module = nn.Linear(3, 2)
    p.l1_unstructured(module, "weight", amount=1)
    p.remove(module, "weight")
    names = [name for name, _ in module.named_parameters()]
    if p is torch_prune:
        assert names == ["bias", "weight"]
    else:
        assert names == ["weight", "bias"]


# --- state dicts between pruned and unpruned models ----------------------------------------------


def plain_model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def test_a_pruned_state_dict_loads_into_an_unpruned_model():
    pruned = pruned_model()
    with pytest.raises(RuntimeError, match="Missing key"):
        plain_model().load_state_dict(pruned.state_dict())

    target = plain_model()
    prunereg.load_state_dict(target, pruned.state_dict())
    x = torch.randn(5, 4)
    assert torch.equal(target(x), pruned(x))
    assert not prunereg.is_pruned(target)
    assert list(target.state_dict()) == list(plain_model().state_dict())


def test_an_unpruned_state_dict_loads_into_a_pruned_model():
    source = plain_model()
    target = pruned_model()
    masks = {name: t.clone() for name, t in target.state_dict().items() if name.endswith("_mask")}
    with pytest.raises(RuntimeError, match="Unexpected key"):
        target.load_state_dict(source.state_dict())

    prunereg.load_state_dict(target, source.state_dict())
    assert torch.equal(target[0].weight_orig, source[0].weight)
    for name, mask in masks.items():
        assert torch.equal(target.state_dict()[name], mask)
    # module.weight is up to date at once, not only after the next forward.
    assert torch.equal(target[0].weight, source[0].weight * target[0].weight_mask)


def test_load_state_dict_keeps_strict_checking():
    with pytest.raises(RuntimeError, match="Missing key"):
        prunereg.load_state_dict(plain_model(), {"0.weight": torch.zeros(3, 4)})
    result = prunereg.load_state_dict(plain_model(), {"0.weight": torch.zeros(3, 4)}, strict=False)
    assert "0.bias" in result.missing_keys


# --- NaN policy ----------------------------------------------------------------------------------


def test_nan_scores_are_pruned_first():
    weights = torch.tensor([[0.5, math.nan, -2.0, 3.0, math.nan, 0.1]])
    kept = {}
    for label, p in (("torch", torch_prune), ("prunereg", prune)):
        module = nn.Linear(6, 1, bias=False)
        with torch.no_grad():
            module.weight.copy_(weights)
        p.l1_unstructured(module, "weight", amount=2)
        kept[label] = module.weight_mask
    assert torch.equal(kept["torch"], torch.tensor([[0.0, 1, 1, 1, 1, 0]]))  # torch keeps NaN weights
    assert torch.equal(kept["prunereg"], torch.tensor([[1.0, 0, 1, 1, 0, 1]]))


# --- PruningContainer with several methods --------------------------------------------------------


def test_pruning_container_of_several_methods():
    methods = [prune.L1Unstructured(1), prune.L1Unstructured(2)]
    torch_methods = [torch_prune.L1Unstructured(1), torch_prune.L1Unstructured(2)]
    for method in methods + torch_methods:
        method._tensor_name = "weight"
    with pytest.raises(AttributeError):
        torch_prune.PruningContainer(*torch_methods)
    assert list(prune.PruningContainer(*methods)) == methods
