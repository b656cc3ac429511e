"""The dense model's trajectory over the calibration set: where each recovered block's targets come from.

The teacher's hidden states advance block by block, in place, as the
student's do; the states after a block (and after the blocks removed right
after it) are that block's targets, and then the teacher's next inputs, so no
copy is kept. The residual stream after a block's attention, which an
attention refit matches, is the block's output less its MLP's output. The
teacher's blocks are fetched from its :class:`BlockWeights` as they run (an
FSDP2-sharded teacher: gathered one at a time) and given back unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import Tensor, nn

from prunereg._recover.parts import block_parts
from prunereg._recover.runtime import BlockInputs, BlockWeights, InMemory, advance


class TeacherTrajectory:
    """The teacher's blocks and their calibration inputs, run forward a span of blocks at a time."""

    def __init__(self, blocks: nn.ModuleList, inputs: BlockInputs, weights: BlockWeights | None = None) -> None:
        self.blocks = blocks
        self.inputs = inputs
        self.weights: BlockWeights = weights if weights is not None else InMemory()
        self._held: int | None = None

    def next_inputs(self) -> list[Tensor]:
        """The hidden states the next span reads, per batch: a list of its own, as :meth:`run` replaces them."""
        return list(self.inputs.hidden)

    @contextlib.contextmanager
    def holding(self, index: int) -> Iterator[nn.Module]:
        """Teacher block ``index`` fetched for the ``with`` block (to compare with the student's), then given back.

        A :meth:`run` inside it that reaches the block uses it as it is and gives it back after.
        """
        block = self.blocks[index]
        self.weights.fetch(index, block)
        self._held = index
        try:
            yield block
        finally:
            self._give_back(index)

    def run(self, span: tuple[int, ...], *, attention: bool = False) -> tuple[list[Tensor], list[Tensor] | None]:
        """Advance through the blocks of ``span``: the hidden states after them, and after the first one's attention.

        The attention residuals are given when ``attention`` asks for them and
        the first block has an MLP module (else None).
        """
        residuals: list[Tensor] | None = None
        for position, index in enumerate(span):
            block = self.blocks[index]
            if self._held != index:
                self.weights.fetch(index, block)
                self._held = index
            try:
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
            finally:
                self._give_back(index)
        return list(self.inputs.hidden), residuals

    def _give_back(self, index: int) -> None:
        if self._held == index:
            self._held = None
            self.weights.done(index, self.blocks[index], pruned=False)
