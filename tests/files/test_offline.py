"""Offline pruning of named tensors, compared with torch.nn.utils.prune on the same tensors and seed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from torch import nn

import prunereg
from prunereg._files import offline as _offline
from prunereg._files.offline import OfflinePruningError
from prunereg._selection.amount import compute_norm
from tests.support.torch_reference import TORCH_CLASSES


@pytest.fixture
def value_device(device: str) -> str:
    """The devices whose tensors hold values; meta is refused (test_meta_device_is_refused)."""
    if device == "meta":
        pytest.skip("meta tensors hold no values to prune")
    return device


def distinct(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Values of distinct magnitudes, exact in every float dtype: no ties for a threshold to break."""
    generator = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    magnitudes = (torch.randperm(n, generator=generator) + 1).to(torch.float64)
    signs = torch.randint(0, 2, (n,), generator=generator) * 2 - 1
    return (magnitudes * signs).reshape(shape).to(dtype)


def torch_reference(
    tensors: dict[str, torch.Tensor],
    method: str,
    arguments: dict,
    *,
    seed: int,
    device: str = "cpu",
    together: bool = False,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """What torch gives each tensor as the parameter ``weight`` of its own module."""
    modules = {}
    for name, tensor in tensors.items():
        module = nn.Module()
        module.register_parameter("weight", nn.Parameter(tensor.clone().to(device)))
        modules[name] = module
    torch.manual_seed(seed)
    if together:
        torch_prune.global_unstructured([(m, "weight") for m in modules.values()], TORCH_CLASSES[method], **arguments)
    else:
        for module in modules.values():
            TORCH_CLASSES[method].apply(module, "weight", **arguments)
    return {name: (m.weight.detach().cpu(), m.weight_mask.cpu()) for name, m in modules.items()}


def offline(
    tensors: dict[str, torch.Tensor],
    method: str,
    arguments: dict,
    *,
    seed: int,
    device: str = "cpu",
    together: bool = False,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    factory = _offline.method_factory(method, arguments, together=together)
    found = _offline.prune(tensors, factory, together=together, device=device, seed=seed)
    return {name: (pruned, mask) for name, pruned, mask in found}


def assert_matches_torch(
    tensors: dict, method: str, arguments: dict, *, seed: int, device: str = "cpu", together: bool = False
) -> None:
    """Equal masks and pruned tensors, or an OfflinePruningError where torch raises."""
    try:
        expected = torch_reference(tensors, method, arguments, seed=seed, device=device, together=together)
    except (ValueError, IndexError, RuntimeError):
        with pytest.raises(OfflinePruningError):
            offline(tensors, method, arguments, seed=seed, device=device, together=together)
        return
    found = offline(tensors, method, arguments, seed=seed, device=device, together=together)
    assert list(found) == list(tensors)
    for name, (pruned, mask) in found.items():
        expected_pruned, expected_mask = expected[name]
        assert pruned.dtype == tensors[name].dtype and pruned.device == tensors[name].device
        assert torch.equal(pruned, expected_pruned), name
        assert mask.dtype == torch.bool
        assert torch.equal(mask, expected_mask.bool()), name


shapes = st.lists(st.integers(1, 5), min_size=2, max_size=3).map(tuple)
float_dtypes = st.sampled_from([torch.float32, torch.float64, torch.float16])
amounts = st.one_of(st.floats(0, 1), st.integers(0, 8))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    tensor_shapes=st.lists(shapes, min_size=1, max_size=3),
    dtype=float_dtypes,
    seed=st.integers(0, 2**31),
    method=st.sampled_from(sorted(TORCH_CLASSES)),
)
def test_each_tensor_pruned_as_torch_prunes_its_parameter(
    value_device: str, data: st.DataObject, tensor_shapes: list, dtype: torch.dtype, seed: int, method: str
) -> None:
    tensors = {f"layer{i}.weight": distinct(shape, dtype, seed + i) for i, shape in enumerate(tensor_shapes)}
    arguments: dict = {} if method == "identity" else {"amount": data.draw(amounts, "amount")}
    if method.endswith("structured") and "unstructured" not in method:
        arguments["dim"] = data.draw(st.integers(-2, 1), "dim")
    if method == "ln_structured":
        arguments["n"] = data.draw(st.sampled_from([1, 2, 3, math.inf, -math.inf]), "n")
        for tensor in tensors.values():
            norms = compute_norm(tensor.double(), arguments["n"], arguments["dim"])
            assume(len(set(norms.tolist())) == norms.numel())
    assert_matches_torch(tensors, method, arguments, seed=seed, device=value_device)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tensor_shapes=st.lists(shapes, min_size=1, max_size=4),
    dtype=float_dtypes,
    seed=st.integers(0, 2**31),
    method=st.sampled_from(["l1_unstructured", "random_unstructured"]),
    amount=st.one_of(st.floats(0, 1), st.integers(0, 40)),
)
def test_global_pruning_equals_torch_global_unstructured(
    value_device: str, tensor_shapes: list, dtype: torch.dtype, seed: int, method: str, amount: float
) -> None:
    sizes = [math.prod(shape) for shape in tensor_shapes]
    flat = distinct((sum(sizes),), dtype, seed)  # distinct across tensors too
    tensors = {f"t{i}": piece.reshape(shape) for i, (piece, shape) in enumerate(zip(flat.split(sizes), tensor_shapes))}
    assert_matches_torch(tensors, method, {"amount": amount}, seed=seed, device=value_device, together=True)


def test_a_known_example() -> None:
    weight = torch.tensor([[0.1, -3.0, 2.0], [-0.5, 4.0, 0.2]])
    ((name, pruned, mask),) = _offline.prune({"w": weight}, _offline.method_factory("l1_unstructured", {"amount": 3}))
    assert name == "w"
    assert pruned.tolist() == [[0.0, -3.0, 2.0], [0.0, 4.0, 0.0]]
    assert mask.tolist() == [[False, True, True], [False, True, False]]


def test_pruned_nan_stays_nan_as_in_torch() -> None:
    weight = torch.tensor([[float("nan"), 1.0], [2.0, 3.0]])
    ((_, pruned, mask),) = _offline.prune({"w": weight}, _offline.method_factory("l1_unstructured", {"amount": 1}))
    module = nn.Linear(2, 2, bias=False)
    module.weight.data = weight.clone()
    torch_prune.custom_from_mask(module, "weight", mask)
    assert torch.equal(pruned.isnan(), module.weight.isnan()) and bool(pruned.isnan()[0, 0])
    assert mask.tolist() == [[False, True], [True, True]]  # NaN is pruned first (prunereg's documented policy)


def test_method_factory_builds_a_fresh_method_each_call() -> None:
    factory = _offline.method_factory("ln_structured", {"amount": 0.5, "n": math.inf, "dim": 0})
    first, second = factory(), factory()
    assert first is not second and isinstance(first, prunereg.get("ln_structured"))
    assert (first.amount, first.n, first.dim) == (0.5, math.inf, 0)


@pytest.mark.parametrize(
    ("method", "arguments", "together", "error", "message"),
    [
        ("l1_unstuctured", {"amount": 0.5}, False, prunereg.UnknownMethodError, "did you mean 'l1_unstructured'"),
        (
            "identity",
            {"amount": 0.5},
            False,
            OfflinePruningError,
            "'identity' does not take argument 'amount' \\(it takes: no arguments\\)",
        ),
        (
            "l1_unstructured",
            {"amount": 0.5, "dim": 0},
            False,
            OfflinePruningError,
            "does not take argument 'dim' \\(it takes: amount\\)",
        ),
        ("ln_structured", {"amount": 0.5}, False, OfflinePruningError, "'ln_structured' needs argument 'n'"),
        ("l1_unstructured", {}, False, OfflinePruningError, "needs argument 'amount'"),
        ("l1_unstructured", {"amount": 1.5}, False, OfflinePruningError, "bad arguments .*amount=1.5 should"),
        ("l1_unstructured", {"amount": -1}, False, OfflinePruningError, "bad arguments .*amount=-1 should"),
        ("l1_unstructured", {"amount": "half"}, False, OfflinePruningError, "Invalid type for amount: half"),
        ("custom_from_mask", {}, False, OfflinePruningError, "needs a tensor for argument 'mask'"),
        (
            "ln_structured",
            {"amount": 0.5, "n": 2},
            True,
            OfflinePruningError,
            "global pruning needs an unstructured method; 'ln_structured' is structured",
        ),
        ("custom_from_mask", {}, True, OfflinePruningError, "'custom_from_mask' is global"),
    ],
)
def test_method_factory_refuses(method: str, arguments: dict, together: bool, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        _offline.method_factory(method, arguments, together=together)


def test_errors_while_pruning_name_the_tensor() -> None:
    tensors = {"small": torch.ones(2, 2), "large": torch.ones(4, 4)}
    with pytest.raises(OfflinePruningError, match=r"cannot prune 'small' \(shape \[2, 2\]\): ValueError: amount=5"):
        list(_offline.prune(tensors, _offline.method_factory("l1_unstructured", {"amount": 5})))
    with pytest.raises(OfflinePruningError, match=r"cannot prune 'small' .*IndexError: Invalid index 3"):
        list(_offline.prune(tensors, _offline.method_factory("random_structured", {"amount": 1, "dim": 3})))
    with pytest.raises(OfflinePruningError, match="cannot prune the selected tensors together: ValueError: amount=21"):
        list(
            _offline.prune(
                tensors, _offline.method_factory("l1_unstructured", {"amount": 21}, together=True), together=True
            )
        )


def test_meta_device_is_refused() -> None:
    with pytest.raises(OfflinePruningError, match="meta device"):
        _offline.compute_device("meta")


def test_unknown_and_missing_devices_are_refused() -> None:
    with pytest.raises(OfflinePruningError, match="unknown device 'gpu0'"):
        _offline.compute_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(OfflinePruningError, match="device 'cuda' is not available"):
            _offline.compute_device("cuda")
    assert _offline.compute_device("cpu") == torch.device("cpu")


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))


def test_apply_masks_equals_custom_from_mask_and_keeps_pruned_entries_at_zero(device: str) -> None:
    masks = {"0.weight": torch.rand(6, 4) > 0.5, "2.weight": torch.rand(3, 6) > 0.3}
    ours, theirs = model().to(device), model().to(device)
    assert prunereg.apply_masks(ours, masks) is ours
    for name, mask in masks.items():
        torch_prune.custom_from_mask(theirs.get_submodule(name[0]), "weight", mask.to(device))  # torch needs it there
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for key, value in theirs.state_dict().items():
        assert ours.state_dict()[key].dtype == value.dtype
        if device != "meta":
            assert torch.equal(ours.state_dict()[key], value), key
    if device == "meta":
        return
    ours.train()
    ours(torch.randn(5, 4, device=device)).sum().backward()
    for name, mask in masks.items():
        module = ours.get_submodule(name[0])
        assert torch.all(module.weight[~mask.to(device)] == 0)
        assert torch.all(module.weight_orig.grad[~mask.to(device)] == 0)


def test_apply_masks_from_a_file(tmp_path: Path) -> None:
    masks = {"0.weight": torch.rand(6, 4) > 0.5}
    path = tmp_path / "masks.safetensors"
    save_file(masks, path)
    pruned = prunereg.apply_masks(model(), str(path))
    assert torch.equal(pruned[0].weight_mask, masks["0.weight"].float())
    assert prunereg.is_pruned(pruned) and not prunereg.is_pruned(pruned[2])


@pytest.mark.parametrize(
    ("masks", "error", "message"),
    [
        (
            {"0.weight": torch.ones(6, 4, dtype=torch.bool), "9.weight": torch.ones(1, dtype=torch.bool)},
            KeyError,
            "no tensor '9.weight'",
        ),
        (
            {"0.weight": torch.ones(6, 4, dtype=torch.bool), "2.nothing": torch.ones(1, dtype=torch.bool)},
            KeyError,
            "no tensor '2.nothing'",
        ),
        (
            {"0.weight": torch.ones(6, 4, dtype=torch.bool), "2.weight": torch.ones(6, 3, dtype=torch.bool)},
            ValueError,
            r"has shape \[6, 3\], the tensor \[3, 6\]",
        ),
        # a buffer is no Parameter: found only while pruning, after 0.weight was pruned, which must be undone
        (
            {"0.weight": torch.ones(6, 4, dtype=torch.bool), "1.running_mean": torch.ones(6, dtype=torch.bool)},
            TypeError,
            "torch.nn.Parameter or None required",
        ),
    ],
)
def test_apply_masks_changes_nothing_on_error(masks: dict, error: type, message: str) -> None:
    target = model()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(error, match=message):
        prunereg.apply_masks(target, masks)
    assert not prunereg.is_pruned(target)
    assert list(target.state_dict()) == list(before)
    assert all(torch.equal(target.state_dict()[k], v) for k, v in before.items())
    assert isinstance(target[0].weight, nn.Parameter) and "weight" in target[0]._parameters
