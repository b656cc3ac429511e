"""Model files for the file-pruning tests: a small model in every layout, and what torch makes of it."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.utils.prune as torch_prune
from safetensors.torch import save_file
from torch import nn

from prunereg._files import checkpoint
from tests.support.torch_reference import TORCH_CLASSES

CASES = [
    ("identity", {}),
    ("l1_unstructured", {"amount": 0.4}),
    ("l1_unstructured", {"amount": 5}),
    ("random_unstructured", {"amount": 0.3}),
    ("random_structured", {"amount": 0.5, "dim": 0}),
    ("ln_structured", {"amount": 1, "n": 2, "dim": 1}),
    ("ln_structured", {"amount": 0.5, "n": math.inf, "dim": -1}),
    ("ln_structured", {"amount": 0.34, "n": -math.inf, "dim": 0}),
]
LAYOUTS = ["safetensors", "state_dict_pt", "checkpoint_state_dict", "checkpoint_model"]


def make_model() -> nn.Module:
    """Conv, linear, norm layers and an integer buffer; weights of distinct magnitudes (no ties)."""
    model = nn.Sequential()
    model.add_module("conv", nn.Conv2d(3, 4, 2))
    model.add_module("fc1", nn.Linear(12, 6))
    model.add_module("norm", nn.BatchNorm1d(6))
    model.add_module("fc2", nn.Linear(6, 5))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            n = parameter.numel()
            magnitudes = (torch.randperm(n, generator=generator) + 1) / n + torch.rand(n, generator=generator) / (4 * n)
            signs = torch.randint(0, 2, (n,), generator=generator) * 2 - 1
            parameter.copy_((magnitudes * signs).reshape(parameter.shape))
    return model


def write_checkpoint(directory: Path, layout: str, model: nn.Module) -> Path:
    state = model.state_dict()
    if layout == "safetensors":
        path = directory / "model.safetensors"
        save_file(dict(state), path, metadata={"format": "pt", "source": "test"})
    elif layout == "state_dict_pt":
        path = directory / "model.pt"
        torch.save(state, path)
    elif layout == "checkpoint_state_dict":
        path = directory / "ckpt.pth"
        torch.save({"epoch": 5, "state_dict": state, "optimizer": {"lr": 0.1}}, path)
    else:
        path = directory / "ckpt.bin"
        torch.save({"model": state, "config": {"hidden": 6}}, path)
    return path


def torch_reference(
    method: str, arguments: dict, seed: int, names: list[str], *, together: bool = False, device: str = "cpu"
) -> nn.Module:
    """The model pruned by torch.nn.utils.prune, tensor by tensor in file order (or globally)."""
    model = make_model().to(device)
    pairs = [(model.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2]) for name in names]
    torch.manual_seed(seed)
    if together:
        torch_prune.global_unstructured(pairs, TORCH_CLASSES[method], **arguments)
    else:
        for module, tensor_name in pairs:
            TORCH_CLASSES[method].apply(module, tensor_name, **arguments)
    return model.cpu()


def assert_pruned_as_torch(output: Path, masks: Path | None, reference: nn.Module, names: list[str]) -> None:
    """Selected tensors equal torch's pruned parameters, the others equal the original model's."""
    original = make_model().state_dict()
    produced = checkpoint.read(output).tensors
    assert sorted(produced) == sorted(original)
    for key, value in original.items():
        if key in names:
            module, tensor_name = reference.get_submodule(key.rpartition(".")[0]), key.rpartition(".")[2]
            expected = getattr(module, tensor_name)
        else:
            expected = value
        assert produced[key].dtype == expected.dtype and torch.equal(produced[key], expected), key
    if masks is not None:
        saved = checkpoint.read(masks).tensors
        assert sorted(saved) == sorted(names)
        for key in names:
            module, tensor_name = reference.get_submodule(key.rpartition(".")[0]), key.rpartition(".")[2]
            assert saved[key].dtype == torch.bool
            assert torch.equal(saved[key], getattr(module, tensor_name + "_mask").bool()), key


WEIGHTS = ["conv.weight", "fc1.weight", "fc2.weight"]


def prune_every_builtin_as_torch(
    directory: Path, layout: str, method: str, arguments: dict, run: Callable[[Path, Path, Path], object]
) -> object:
    """``run(path, output, masks)`` with seed 7 must write what torch makes of ``make_model()``, and nothing else.

    Returns what ``run`` returned, for the caller's own checks.
    """
    path = write_checkpoint(directory, layout, make_model())
    data = path.read_bytes()
    output, masks = directory / f"out{path.suffix}", directory / "masks.safetensors"
    returned = run(path, output, masks)
    assert path.read_bytes() == data
    assert sorted(os.listdir(directory)) == sorted([path.name, output.name, masks.name])  # no temporary left
    assert_pruned_as_torch(output, masks, torch_reference(method, arguments, 7, WEIGHTS), WEIGHTS)
    return returned
