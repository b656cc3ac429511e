"""On a model pruned by oneshot, every recovery method keeps every zero, and still recovers the kept weights."""

from __future__ import annotations

import copy
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from torch import nn

import prunereg
from tests.shrink.models import build, calibration_ids

METHODS: dict[str, dict[str, Any]] = {"refit": {}, "blockwise": {"epochs": 2}, "distill": {"max_tokens": 96}}


def _pruned(architecture: str = "llama", seed: int = 0) -> tuple[nn.Module, nn.Module, dict[str, torch.Tensor]]:
    model = build(architecture, seed)
    teacher = copy.deepcopy(model)
    prunereg.oneshot(model, "wanda", calibration=calibration_ids(), sparsity=0.5, progress=False)
    zeros = {name: p.detach() == 0 for name, p in model.named_parameters() if p.dim() >= 2 and bool((p == 0).any())}
    return model, teacher, zeros


def _assert_zeros_kept(model: nn.Module, zeros: dict[str, torch.Tensor]) -> None:
    for name, zero in zeros.items():
        assert bool((model.get_parameter(name)[zero] == 0).all()), name


@pytest.mark.parametrize("architecture", ["llama", "mixtral"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_zero_stays_zero_and_kept_weights_move(architecture: str, method: str) -> None:
    model, teacher, zeros = _pruned(architecture)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    report = prunereg.recover(model, teacher, calibration_ids(), method, **METHODS[method], progress=False)
    _assert_zeros_kept(model, zeros)
    moved = [name for name in zeros if not torch.equal(model.get_parameter(name), before[name])]
    assert moved or report.undone, str(report)


def test_replace_leaves_a_pruned_down_projection_as_it_was() -> None:
    model, teacher, _ = _pruned(seed=1)
    removed = prunereg.shrink(model, "block_influence", calibration_ids(), layers=1, progress=False).removed_blocks
    assert removed == [1]  # block 0 is followed by a removed block: replace has a down projection to fold into
    report = prunereg.recover(model, teacher, calibration_ids(), "replace", removed_blocks=removed, progress=False)
    assert any("holds pruned zeros" in step.note for step in report.steps)
    assert not any(step.changed for step in report.steps)


def _with_chance_zeros(model: nn.Module) -> None:
    """Zero a few entries (under 1 %) of every block weight, as a checkpoint dequantised from 4 bits has them."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() >= 2 and ".layers." in name:
                chosen = torch.randperm(parameter.numel(), generator=generator)[: max(1, parameter.numel() // 500)]
                parameter.view(-1)[chosen] = 0


def test_a_dense_model_with_a_few_chance_zeros_is_not_taken_for_a_pruned_one() -> None:
    model = build("llama", 1)
    _with_chance_zeros(model)
    teacher = copy.deepcopy(model)
    removed = prunereg.shrink(model, "block_influence", calibration_ids(), layers=1, progress=False).removed_blocks
    report = prunereg.recover(model, teacher, calibration_ids(), "replace", removed_blocks=removed, progress=False)
    assert not any("holds pruned zeros" in step.note for step in report.steps), str(report)
    assert any("mlp.down_proj.weight" in step.changed for step in report.steps), str(report)
    # Training may fill them too; an explicit keep_zeros still keeps every zero it finds.
    with_zeros = {name for name, p in model.named_parameters() if p.dim() >= 2 and bool((p == 0).any())}
    assert with_zeros and set(prunereg.keep_zeros(model)) == with_zeros


def test_keep_zeros_holds_through_adamw_steps_with_weight_decay() -> None:
    model, _, zeros = _pruned()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ids = calibration_ids()
    with prunereg.keep_zeros(model, optimizer) as keeper:
        assert set(keeper) == set(zeros)
        for _ in range(3):
            optimizer.zero_grad()
            model(ids, labels=ids).loss.backward()
            for name, zero in zeros.items():
                assert bool((model.get_parameter(name).grad[zero] == 0).all()), name
            optimizer.step()
    _assert_zeros_kept(model, zeros)
    optimizer.zero_grad()
    model(ids, labels=ids).loss.backward()
    name = next(iter(zeros))
    assert bool((model.get_parameter(name).grad[zeros[name]] != 0).any())  # the hooks are off after the block
