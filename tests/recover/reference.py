"""Float64 transcriptions of ``refit`` and ``replace`` from their descriptions, for the differential tests.

They share nothing with prunereg's code: every activation comes from hooks on
a full forward of the Hugging Face model, and every fit from numpy's ``lstsq``
on the tokens themselves, damped by stacking ``sqrt(lambda) I`` under the
inputs (the intercept column undamped), so no normal equations are formed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn


def activations(model: nn.Module, ids: torch.Tensor, wanted: dict[str, tuple[nn.Module, str]]) -> dict[str, np.ndarray]:
    """Per name, a module's input (``"in"``) or output (``"out"``) on ``ids``, as float64 rows ``[tokens, width]``."""
    seen: dict[str, np.ndarray] = {}
    handles = []
    for name, (module, side) in wanted.items():

        def keep(_: nn.Module, args: Any, output: Any, name: str = name, side: str = side) -> None:
            value = args[0] if side == "in" else (output[0] if isinstance(output, tuple) else output)
            seen[name] = value.detach().double().reshape(-1, value.shape[-1]).numpy()

        handles.append(module.register_forward_hook(keep))
    try:
        with torch.no_grad():
            model(ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def damped_lstsq(inputs: np.ndarray, wanted: np.ndarray, ridge: float, intercept: bool) -> tuple[np.ndarray, Any]:
    """``argmin ||X W^T + b - R||^2 + lambda ||W||^2``, lambda = ridge * mean(diag(X^T X)): ``(W [out, in], b)``."""
    n_tokens, n_in = inputs.shape
    lam = ridge * float(np.mean(np.sum(inputs * inputs, axis=0)))
    columns = [inputs] + ([np.ones((n_tokens, 1))] if intercept else [])
    damping = np.sqrt(lam) * np.eye(n_in, n_in + intercept)
    system = np.vstack([np.hstack(columns), damping])
    rhs = np.vstack([wanted, np.zeros((n_in, wanted.shape[1]))])
    solution = np.linalg.lstsq(system, rhs, rcond=None)[0]
    return solution[:n_in].T, (solution[n_in] if intercept else None)


def masked_lstsq(
    inputs: np.ndarray, wanted: np.ndarray, kept: np.ndarray, ridge: float, intercept: bool
) -> tuple[np.ndarray, Any]:
    """:func:`damped_lstsq` row by row, each output over its kept inputs only (the others exactly zero)."""
    lam = ridge * float(np.mean(np.sum(inputs * inputs, axis=0)))
    weight = np.zeros((wanted.shape[1], inputs.shape[1]))
    bias = np.zeros(wanted.shape[1]) if intercept else None
    for row in range(wanted.shape[1]):
        columns = np.flatnonzero(kept[row])
        x = inputs[:, columns]
        parts = [x] + ([np.ones((x.shape[0], 1))] if intercept else [])
        system = np.vstack([np.hstack(parts), np.sqrt(lam) * np.eye(len(columns), len(columns) + intercept)])
        rhs = np.concatenate([wanted[:, row], np.zeros(len(columns))])
        solution = np.linalg.lstsq(system, rhs, rcond=None)[0]
        weight[row, columns] = solution[: len(columns)]
        if bias is not None:
            bias[row] = solution[-1]
    return weight, bias


def write(layer: nn.Linear, weight: np.ndarray, bias: Any) -> None:
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight))
        if bias is not None:
            assert layer.bias is not None
            layer.bias.copy_(torch.from_numpy(bias))


Solver = Callable[[np.ndarray, np.ndarray, nn.Linear], tuple[np.ndarray, Any]]


def refit(student: nn.Module, teacher: nn.Module, ids: torch.Tensor, solve: Solver, writers: tuple[str, ...]) -> None:
    """Refit ``student`` in place, block by block: o_proj to the dense residual after attention, then down_proj.

    Block ``i`` of the student is the teacher's block ``i`` (no block removed).
    """
    blocks, dense = student.model.layers, teacher.model.layers
    for index, block in enumerate(blocks):
        reference = dense[index]
        targets = activations(teacher, ids, {"out": (reference, "out"), "mlp": (reference.mlp, "out")})
        if "attention" in writers:
            seen = activations(student, ids, {"x": (block, "in"), "o": (block.self_attn.o_proj, "in")})
            wanted = targets["out"] - targets["mlp"] - seen["x"]
            write(block.self_attn.o_proj, *solve(seen["o"], wanted, block.self_attn.o_proj))
        if "mlp" in writers:
            down = block.mlp.down_proj
            seen = activations(student, ids, {"y": (block, "out"), "d": (down, "out"), "x": (down, "in")})
            wanted = targets["out"] - (seen["y"] - seen["d"])
            write(down, *solve(seen["x"], wanted, down))


def replace(
    student: nn.Module, teacher: nn.Module, ids: torch.Tensor, removed: list[int], ridge: float, intercept: bool
) -> None:
    """ReplaceMe's fold, for each block followed by removed blocks: ``M T + c ~ Y_after_span - H``."""
    kept = [i for i in range(len(teacher.model.layers)) if i not in removed]
    for index, block in enumerate(student.model.layers):
        following = kept[index + 1] if index + 1 < len(kept) else len(teacher.model.layers)
        if following == kept[index] + 1:
            continue
        last = teacher.model.layers[following - 1]
        target = activations(teacher, ids, {"out": (last, "out")})["out"]
        seen = activations(student, ids, {"y": (block, "out"), "m": (block.mlp, "out")})
        transform, shift = damped_lstsq(seen["m"], target - (seen["y"] - seen["m"]), ridge, intercept)
        down = block.mlp.down_proj
        weight = transform @ down.weight.detach().double().numpy()
        bias = None
        if intercept:
            old = down.bias.detach().double().numpy() if down.bias is not None else np.zeros(weight.shape[0])
            bias = transform @ old + shift
        write(down, weight, bias)
