"""Whole pruned models pickled by prunereg 0.1 (8d48cee), before the modules moved into subpackages, still load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import prunereg
import prunereg.prune as prune
from tests.support.legacy_model import Net

PICKLE = Path(__file__).resolve().parents[1] / "data" / "pruned_model_8d48cee.pt"
OLD_CLASSES = {
    "prunereg._attention.RefreshPruned",
    "prunereg._custom.CustomFromMask",
    "prunereg._method.PruningContainer",
}


def _hook_classes(model: nn.Module) -> set[type]:
    return {type(hook) for module in model.modules() for hook in module._forward_pre_hooks.values()}


def test_the_pickle_names_the_old_module_paths() -> None:
    """The fixture really is an old pickle: it names classes at paths that no longer exist as files."""
    data = PICKLE.read_bytes()
    for name in OLD_CLASSES:
        module, _, cls = name.rpartition(".")
        assert module.encode() in data and cls.encode() in data
        assert not (Path(prunereg.__file__).parent / f"{module.rpartition('.')[2]}.py").exists()


def _check_loaded(saved: dict[str, object]) -> None:
    model = saved["model"]
    assert isinstance(model, Net)
    assert prunereg.is_pruned(model)
    classes = _hook_classes(model)
    assert {prunereg.PruningContainer, prune.CustomFromMask} <= classes
    model.eval()
    with torch.no_grad():
        output = model(saved["input"])
        # Bit for bit what a plain model with the masked values computes on this CPU; within rounding of the
        # output recorded when it was pickled (matmul kernels differ between processors in their last bits).
        assert torch.equal(output, _plain_copy(model)(saved["input"]))
        torch.testing.assert_close(output, saved["output"], rtol=1e-5, atol=1e-6)
    # The loaded model keeps pruning: a third method joins the container, and remove makes it permanent.
    prune.l1_unstructured(model.fc1, "weight", amount=0.5)
    assert int((model.fc1.weight == 0).sum()) >= 24
    prunereg.remove(model.fc1, "weight")
    assert "weight" in dict(model.fc1.named_parameters())


def _plain_copy(model: Net) -> Net:
    """A fresh ``Net`` holding the pruned model's current (masked) values as plain parameters."""
    plain = Net().eval()
    with torch.no_grad():
        for name, parameter in plain.named_parameters():
            module_name, _, attribute = name.rpartition(".")
            module = model.get_submodule(module_name) if module_name else model
            parameter.copy_(getattr(module, attribute))
    return plain


def test_an_old_pickle_loads_with_weights_only_false() -> None:
    _check_loaded(torch.load(PICKLE, weights_only=False))


def test_an_old_pickle_loads_with_weights_only_within_safe_globals() -> None:
    classes = (Net, nn.Linear, nn.MultiheadAttention, nn.modules.linear.NonDynamicallyQuantizableLinear)
    with torch.serialization.safe_globals(list(classes)), pytest.raises(Exception, match=r"prunereg\._"):
        torch.load(PICKLE, weights_only=True)  # the model's own classes are not enough
    with prunereg.safe_globals(*classes):
        _check_loaded(torch.load(PICKLE, weights_only=True))


def test_a_new_pickle_names_the_new_paths_and_loads(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4))
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    path = tmp_path / "model.pt"
    torch.save(model, path)
    assert b"prunereg._core.method" in path.read_bytes()
    with prunereg.safe_globals(nn.Sequential, nn.Linear):
        loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded[0].weight, model[0].weight)
