"""``replace``: the blocks removed after a block replaced by a linear map folded into that block's MLP (ReplaceMe).

For a block followed by a removed span, a map ``T`` (hidden x hidden) is
fitted by least squares from the block's MLP output ``M`` to what the dense
model's blocks through the span added to the residual stream beyond the
block's attention: ``M T + c ~ Y - H``, ``Y`` the dense model's hidden states
after the span, ``H`` the block's residual stream after its attention. As
the MLP's output is linear in its down projection, ``T`` folds into it:
``W <- T^T W``, ``b <- T^T b + c``; for a mixture of experts, into every
expert's down projection and the shared expert's (no intercept). No module is
added and the config stays stock.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from prunereg import RecoveryBlock, RecoveryMethod
from prunereg_recover.least_squares import damped_solution
from prunereg_recover.writing import kept_entries, linear_bias, linear_weight, write

#: How far the folded MLP's output may be from the map applied to the old one, relative to its size: by precision.
_TOLERANCE = {True: 1e-4, False: 3e-2}


class Replace(RecoveryMethod):
    """Fold a damped least-squares map for each removed span of blocks into the MLP of the block before it.

    Acts only on blocks followed by blocks the model no longer has (``layers=``
    in :func:`prunereg.shrink`); ``ridge`` damps the map as ``refit`` damps its
    weights; ``bias=True`` fits an intercept into the down projection's bias,
    switched on where the config can (``mlp_bias``). A span removed before the
    first block has no block to fold into and is left as it is.
    """

    DATA_PARALLEL = True  # it reads the batches through the block's normal equations and losses only

    def __init__(self, ridge: float = 1e-4, bias: bool = True) -> None:
        if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or not ridge >= 0:
            raise ValueError(f"ridge must be a number >= 0, not {ridge!r}")
        if not isinstance(bias, bool):
            raise TypeError(f"bias must be True or False, not {bias!r}")
        self.ridge = float(ridge)
        self.bias = bias

    def __repr__(self) -> str:
        return f"Replace(ridge={self.ridge:g}, bias={self.bias})"

    @property
    def writer_biases(self) -> frozenset[str]:
        return frozenset({"mlp"}) if self.bias else frozenset()

    def recover_block(self, block: RecoveryBlock) -> str | None:
        if not block.removed_after:
            return None
        mlp = block.mlp
        if mlp is None:
            return "no MLP whose output the block adds as it is: nothing to fold the map into"
        downs = _down_projections(block, mlp)
        if not downs:
            return "no down projection prunereg knows in the MLP: nothing to fold the map into"
        if any(kept_entries(block, tensor) is not None for tensor in downs):
            return "the down projection holds pruned zeros, which a folded map would fill: left as it was"
        writer = block.writer("mlp")
        bias = linear_bias(writer) if writer is not None and len(downs) == 1 else None
        equations = block.normal_equations("mlp_output")
        transform, intercept = damped_solution(equations, ridge=self.ridge, intercept=bias is not None)
        originals = [tensor.detach().clone() for tensor in [*downs, *([bias] if bias is not None else [])]]
        before = block.output_of(mlp, 0)
        for tensor in downs:  # [..., hidden, inputs]: the map acts on the rows of each
            write(tensor, transform.to(tensor.device) @ tensor.detach().double())
        if bias is not None and intercept is not None:
            write(bias, transform.to(bias.device) @ bias.detach().double() + intercept.to(bias.device))
        expected = before.double() @ transform.T.to(before.device)
        if intercept is not None:
            expected += intercept.to(before.device)
        error = float((block.output_of(mlp, 0).double() - expected).norm())
        if not error <= _TOLERANCE[before.dtype in (torch.float32, torch.float64)] * float(expected.norm()):
            # the MLP's output is not linear in these tensors after all
            for tensor, original in zip([*downs, *([bias] if bias is not None else [])], originals):
                write(tensor, original)
            return "the MLP's output is not linear in the tensors found: left as it was"
        span = ", ".join(map(str, block.teacher_indices[1:]))
        return f"folded a {transform.shape[0]}x{transform.shape[1]} map for the removed blocks {span}"


def _down_projections(block: RecoveryBlock, mlp: nn.Module) -> list[torch.Tensor]:
    """The tensors the MLP's output is linear in: the writer's weight, or every expert's and shared expert's."""
    writer = block.writer("mlp")
    if writer is not None:
        return [linear_weight(writer)]
    found: list[torch.Tensor] = []
    for name, module in mlp.named_modules():
        if name.rpartition(".")[2] == "down_proj" and isinstance(module, nn.Linear):
            found.append(linear_weight(module))
    experts: Any = getattr(mlp, "experts", None)
    down = getattr(experts, "down_proj", None)
    if isinstance(down, nn.Parameter) and down.dim() == 3:  # [experts, hidden, inputs]
        found.append(down)
    return found
