"""prunereg.prune to the letter of torch.nn.utils.prune: the same signatures, torch's classes, torch's own cases.

PyTorch's ``test/nn/test_pruning.py`` (34 cases) checks its module by calling
it with keywords (``remove(module=m, name="weight")``), by ``isinstance`` against
its classes and by ``mock.patch`` of a class's ``compute_mask``. The last tests
here re-express the cases of that file that such code depends on, pointed at
``prunereg.prune``; the rest of that file's cases are covered by the differential
tests in ``tests/core/test_prune_dropin.py``.
"""

from __future__ import annotations

import inspect
import pickle
from typing import Any
from unittest import mock

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg
import prunereg.prune as prune


def _torchs_callables() -> dict[str, Any]:
    """Every function and class torch's prune module defines, private helpers that prunereg.prune also has included."""
    return {
        name: value
        for name, value in vars(torch_prune).items()
        if (inspect.isfunction(value) or inspect.isclass(value))
        and value.__module__ == torch_prune.__name__
        and (not name.startswith("_") or hasattr(prune, name))
    }


def _shape(signature: inspect.Signature) -> list[tuple[str, Any, Any]]:
    """What a caller relies on: each parameter's name, kind and default (annotations are documentation)."""
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def _methods(cls: type) -> dict[str, Any]:
    """The methods ``cls`` defines that callers use: public ones, ``__init__`` and the hook's ``__call__``."""
    return {
        name: getattr(cls, name)
        for name, value in vars(cls).items()
        if callable(getattr(cls, name))
        and (not name.startswith("_") or name in ("__init__", "__call__"))
        and not isinstance(value, type)
    }


@pytest.mark.parametrize("name", sorted(n for n in _torchs_callables() if not n.startswith("_")))
def test_every_public_name_of_torchs_module_is_in_prunereg_prune(name):
    assert name in prune.__all__
    assert hasattr(prune, name)


@pytest.mark.parametrize("name", sorted(_torchs_callables()))
def test_every_function_and_method_takes_torchs_parameters(name):
    theirs, ours = _torchs_callables()[name], getattr(prune, name)
    if inspect.isfunction(theirs):
        assert _shape(inspect.signature(ours)) == _shape(inspect.signature(theirs)), name
        return
    for method, their_method in _methods(theirs).items():
        if method == "__call__":  # torch's hook; prunereg's takes the same arguments
            assert _shape(inspect.signature(getattr(ours, method))) == _shape(inspect.signature(their_method))
            continue
        our_method = getattr(ours, method)
        assert _shape(inspect.signature(our_method)) == _shape(inspect.signature(their_method)), (name, method)


def test_remove_takes_torchs_keywords():
    module = nn.Linear(4, 3)
    prune.l1_unstructured(module=module, name="weight", amount=0.5)
    pruned = module.weight.detach().clone()
    returned = prune.remove(module=module, name="weight")
    assert returned is module and torch.equal(module.weight, pruned)
    prune.l1_unstructured(module, "weight", amount=0.5)
    prunereg.remove(module=module, name="weight")
    assert not prunereg.is_pruned(module)


@pytest.mark.parametrize(
    ("ours", "theirs", "registered", "build"),
    [
        (prune.L1Unstructured, torch_prune.L1Unstructured, "l1_unstructured", lambda cls: cls(amount=0.5)),
        (prune.RandomUnstructured, torch_prune.RandomUnstructured, "random_unstructured", lambda cls: cls(amount=0.5)),
        (prune.LnStructured, torch_prune.LnStructured, "ln_structured", lambda cls: cls(amount=0.5, n=2, dim=0)),
        (prune.RandomStructured, torch_prune.RandomStructured, "random_structured", lambda cls: cls(amount=0.5, dim=0)),
        (prune.Identity, torch_prune.Identity, "identity", lambda cls: cls()),
        (prune.CustomFromMask, torch_prune.CustomFromMask, "custom_from_mask", lambda cls: cls(mask=torch.ones(3, 4))),
        (prune.PruningContainer, torch_prune.PruningContainer, None, lambda cls: cls()),
    ],
)
def test_each_prunereg_class_is_an_instance_of_its_torch_counterpart(ours, theirs, registered, build):
    method = build(ours)
    assert isinstance(method, theirs) and issubclass(ours, theirs)
    if registered is not None:  # the very class the registry hands out
        assert prunereg.get(registered) is ours
    # Only the counterpart: an L1 method is no torch LnStructured.
    others = {torch_prune.L1Unstructured, torch_prune.LnStructured, torch_prune.PruningContainer} - {theirs}
    assert not any(isinstance(method, other) for other in others)


def test_the_masks_are_still_prunereg_s():
    # The classes are torch's only for isinstance: their compute_mask is prunereg's own.
    for ours, theirs in (
        (prune.L1Unstructured, torch_prune.L1Unstructured),
        (prune.LnStructured, torch_prune.LnStructured),
    ):
        assert torch_prune.BasePruningMethod in ours.__mro__
        assert theirs not in ours.__mro__
        assert ours.compute_mask is not theirs.compute_mask
    with mock.patch("torch.nn.utils.prune.L1Unstructured.compute_mask", side_effect=AssertionError("torch's")):
        module = nn.Linear(4, 3)
        prune.l1_unstructured(module, "weight", amount=0.5)
    assert int((module.weight_mask == 0).sum()) == 6


# PyTorch's test/nn/test_pruning.py, the cases that need the names, classes and patch points, re-expressed.


def test_pruning_twice_makes_a_container_of_torchs_classes():  # torch: test_multiple_pruning_calls
    m = nn.Conv3d(2, 2, 2)
    prune.l1_unstructured(m, name="weight", amount=0.1)
    first_mask = m.weight_mask.clone()
    prune.ln_structured(m, name="weight", amount=0.3, n=2, dim=0)
    hook = next(iter(m._forward_pre_hooks.values()))
    assert isinstance(hook, torch_prune.PruningContainer)
    assert hook._tensor_name == "weight" and len(hook) == 2
    assert isinstance(hook[0], torch_prune.L1Unstructured) and isinstance(hook[1], torch_prune.LnStructured)
    assert torch.all(m.weight_mask[first_mask == 0] == 0)
    prune.ln_structured(m, name="weight", amount=0.1, n=float("inf"), dim=1)
    assert next(iter(m._forward_pre_hooks.values()))._tensor_name == "weight"


def test_a_patched_compute_mask_decides_the_mask():  # torch: test_random_pruning, with prunereg's patch point
    m = nn.Linear(5, 2)
    mask = torch.ones_like(m.weight)
    mask[1, 0] = 0
    mask[0, 3] = 0
    with mock.patch("prunereg.prune.RandomUnstructured.compute_mask") as compute_mask:
        compute_mask.return_value = mask
        prune.random_unstructured(m, name="weight", amount=0.9)
    m(torch.ones(1, 5)).sum().backward()
    assert torch.equal(m.weight_orig.grad, mask) and torch.equal(m.bias.grad, torch.ones(2))


def test_a_failing_compute_mask_leaves_the_module_as_it_was():  # torch: test_pruning_rollback
    for m in (nn.Linear(5, 7), nn.Conv3d(2, 2, 2)):
        for name in ("weight", "bias"):
            with mock.patch("prunereg.prune.L1Unstructured.compute_mask") as compute_mask:
                compute_mask.side_effect = Exception("HA!")
                with pytest.raises(Exception, match="HA!"):
                    prune.l1_unstructured(m, name=name, amount=0.9)
            assert name in dict(m.named_parameters())
            assert name + "_mask" not in dict(m.named_buffers()) and name + "_orig" not in dict(m.named_parameters())


def test_keywords_everywhere_and_the_parameter_kept():  # torch: test_pruning_id_consistency, serialization
    m = nn.Linear(5, 2, bias=False)
    parameter = next(iter(m.parameters()))
    prune.random_unstructured(module=m, name="weight", amount=0.9)
    assert next(iter(m.parameters())) is parameter
    copied = pickle.loads(pickle.dumps(m))
    assert torch.equal(copied.weight, m.weight)
    prune.remove(module=m, name="weight")
    assert next(iter(m.parameters())) is parameter


def test_container_masks_by_hand():  # torch: test_pruning_container_compute_mask
    container = prune.PruningContainer()
    container._tensor_name = "test"
    t = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.float32)
    default_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]])
    expected = [
        (prune.L1Unstructured(amount=2), [[0, 0, 1, 0], [1, 1, 0, 1]]),
        (prune.LnStructured(amount=1, n=2, dim=0), [[0, 0, 0, 0], [1, 1, 0, 1]]),
        (prune.LnStructured(amount=1, n=2, dim=1), [[0, 1, 1, 0], [0, 1, 0, 1]]),
    ]
    for method, mask in expected:
        method._tensor_name = "test"
        container.add_pruning_method(method)
        assert torch.equal(container.compute_mask(t, default_mask), torch.tensor(mask, dtype=torch.float32))
    with pytest.raises(TypeError):
        container.add_pruning_method(10)  # type: ignore[arg-type]


def test_torch_pruning_again_appends_to_prunereg_s_container_with_torch_s_masks():
    # torch now takes prunereg's container for its own: it appends its method instead of wrapping the container.
    torch.manual_seed(0)
    ours, theirs = nn.Linear(8, 8), nn.Linear(8, 8)
    theirs.load_state_dict(ours.state_dict())
    prune.l1_unstructured(ours, "weight", amount=0.25)
    prune.ln_structured(ours, "weight", amount=2, n=2, dim=0)
    torch_prune.l1_unstructured(ours, "weight", amount=0.25)
    torch_prune.l1_unstructured(theirs, "weight", amount=0.25)
    torch_prune.ln_structured(theirs, "weight", amount=2, n=2, dim=0)
    torch_prune.l1_unstructured(theirs, "weight", amount=0.25)
    (hook,) = ours._forward_pre_hooks.values()
    assert type(hook) is prune.PruningContainer and len(hook) == 3
    assert torch.equal(ours.weight_mask, theirs.weight_mask)
    x = torch.randn(3, 8)
    for _ in range(2):
        ours(x).sum().backward()
    prune.remove(ours, "weight")
    assert torch.equal(ours.weight, theirs.weight)
