"""What the recovery tests share: a model shrunk or pruned beside its teacher, and model state to compare."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

import prunereg
from tests.shrink.models import build, calibration_ids

#: The shrink each architecture gets before a width method runs: its MLP halved, or (a MoE) its experts.
WIDTH = {
    "llama": ("wanda_sp", {"mlp": 0.5}),
    "qwen2": ("wanda_sp", {"mlp": 0.5}),
    "mistral": ("wanda_sp", {"mlp": 0.5}),
    "phi3": ("wanda_sp", {"mlp": 0.5}),
    "mixtral": ("reap", {"experts": 0.5}),
}
DEPTH = ("block_influence", {"layers": 1})
#: Per architecture, a seed whose model loses a block after the first to DEPTH (so replace has a block to fold into).
DEPTH_SEED = {"llama": 1, "qwen2": 2, "mistral": 0, "phi3": 0, "mixtral": 1}


def shrunk(architecture: str, method: str, options: dict[str, Any], seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """A model of ``architecture`` shrunk by ``method``, and its teacher (the model before)."""
    model = build(architecture, seed)
    teacher = copy.deepcopy(model)
    prunereg.shrink(model, method, calibration_ids(), matmul_precision="highest", **options)
    return model, teacher


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def snapshot(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, Any], list[bool]]:
    """The model's tensors, config and each module's train/eval flag, to check that nothing changed."""
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    config = model.config.to_dict() if hasattr(model, "config") else {}
    return state, config, [module.training for module in model.modules()]


def assert_unchanged(model: nn.Module, before: tuple[dict[str, torch.Tensor], dict[str, Any], list[bool]]) -> None:
    state, config, modes = before
    after = model.state_dict()
    assert after.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(after[name], tensor), name
    if hasattr(model, "config"):
        assert model.config.to_dict() == config
    assert [module.training for module in model.modules()] == modes


class DenseInputsSpy(prunereg.RecoveryMethod):
    """Changes nothing; records each block's dense inputs and its own, and its outputs on both (per batch)."""

    def __init__(self, asks: bool = True) -> None:
        self.asks = asks
        self.seen: list[dict[str, list[torch.Tensor]]] = []

    @property
    def reads_dense_inputs(self) -> bool:
        return self.asks

    def recover_block(self, block: prunereg.RecoveryBlock) -> str | None:
        batches = range(block.n_batches)
        self.seen.append({
            "dense": [block.dense_input(b) for b in batches],
            "own": [block.block_input(b) for b in batches],
            "on dense": [block.forward(b, dense_inputs=True) for b in batches],
            "on own": [block.forward(b) for b in batches],
        })  # fmt: skip
        return None


def block_inputs(model: nn.Module, batches: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Per decoder block of ``model`` (``model.model.layers``), the hidden states it reads on each batch."""
    seen: list[list[torch.Tensor]] = [[] for _ in model.model.layers]

    def keeper(into: list[torch.Tensor]) -> Any:
        def keep(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            into.append(args[0] if args else kwargs["hidden_states"])

        return keep

    hooks = [
        layer.register_forward_pre_hook(keeper(into), with_kwargs=True)
        for layer, into in zip(model.model.layers, seen, strict=True)
    ]
    try:
        with torch.no_grad():
            for batch in batches:
                model(batch, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return seen
