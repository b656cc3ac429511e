"""The dense model's trajectory over the calibration set: where each recovered block's targets come from.

The teacher's hidden states advance block by block, in place, as the
student's do; the states after a block (and after the blocks removed right
after it) are that block's targets, and then the teacher's next inputs, so no
copy is kept. The residual stream after a block's attention, which an
attention refit matches, is the block's output less its MLP's output.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from prunereg._recover.parts import block_parts
from prunereg._recover.runtime import BlockInputs, advance


class TeacherTrajectory:
    """The teacher's blocks and their calibration inputs, run forward a span of blocks at a time."""

    def __init__(self, blocks: nn.ModuleList, inputs: BlockInputs) -> None:
        self.blocks = blocks
        self.inputs = inputs

    def next_inputs(self) -> list[Tensor]:
        """The hidden states the next span reads, per batch: a list of its own, as :meth:`run` replaces them."""
        return list(self.inputs.hidden)

    def run(self, span: tuple[int, ...], *, attention: bool = False) -> tuple[list[Tensor], list[Tensor] | None]:
        """Advance through the blocks of ``span``: the hidden states after them, and after the first one's attention.

        The attention residuals are given when ``attention`` asks for them and
        the first block has an MLP module (else None).
        """
        residuals: list[Tensor] | None = None
        for position, index in enumerate(span):
            block = self.blocks[index]
            mlp = block_parts(block, None).mlp if attention and position == 0 else None
            if mlp is None:
                advance(block, self.inputs)
                continue
            mlp_outputs: list[Tensor] = []

            def keep(_: nn.Module, args: Any, output: Tensor, into: list[Tensor] = mlp_outputs) -> None:
                into.append(output)

            handle = mlp.register_forward_hook(keep)
            try:
                advance(block, self.inputs)
            finally:
                handle.remove()
            residuals = [hidden - out for hidden, out in zip(self.inputs.hidden, mlp_outputs, strict=True)]
        return list(self.inputs.hidden), residuals
