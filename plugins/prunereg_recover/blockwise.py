"""``blockwise``: block-wise local distillation, each block trained to give the dense block's output.

For each block in turn, every parameter of the block is trained with Adam on
the mean squared error between its output and the dense model's at the same
place, over the calibration batches (one batch per step, in an order drawn from
the run's seed), its inputs those the blocks before it, already recovered,
produce (EBFT; Puzzletron's block-wise local distillation). Training starts,
by default, from ``refit``'s closed-form solution of the block's writers: a few
Adam steps per block then go further than from the cut weights (SmolLM2-135M,
FLAP at mlp 0.5, docs/shrinking.md). Memory: one block, its gradients and
Adam's two moments, and one batch's activations. A block stored in half
precision trains in float32 and is stored back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import prunereg
from prunereg import RecoveryBlock, RecoveryMethod
from prunereg_recover.refit import Refit

#: Training dtype of blocks stored in a lower precision.
_HALVES = (torch.float16, torch.bfloat16)


class Blockwise(RecoveryMethod):
    """Train each block with Adam (``lr``, ``epochs`` passes over the calibration batches) to match the dense block.

    One step per calibration batch (``batch_size`` samples, 4 by default), in
    an order drawn anew each epoch from ``seed`` and the block's index, so a run
    is repeated exactly under the same seed. On a masked model the pruned
    weights get no gradient and are zeroed again after each step.
    ``refit_first`` (the default) first solves the block's writers as
    ``refit`` does (with the MLP's biases switched on where the config can:
    ``mlp_bias``), then trains from there; ``refit_first=False`` trains from
    the weights as cut.
    """

    #: What the closed-form start reads (gathered whether or not it runs: the class says what the engine gathers).
    STATISTICS = Refit.STATISTICS

    def __init__(self, epochs: int = 1, lr: float = 1e-3, refit_first: bool = True) -> None:
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs must be an int >= 1, not {epochs!r}")
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
            raise ValueError(f"lr must be a number > 0, not {lr!r}")
        if not isinstance(refit_first, bool):
            raise TypeError(f"refit_first must be True or False, not {refit_first!r}")
        self.epochs = epochs
        self.lr = float(lr)
        self._start = Refit() if refit_first else None

    def __repr__(self) -> str:
        return f"Blockwise(epochs={self.epochs}, lr={self.lr:g}, refit_first={self._start is not None})"

    @property
    def writer_biases(self) -> frozenset[str]:
        # The MLP's alone: Llama's attention_bias would also give q/k/v biases, which training makes nonzero for good.
        return self._start.writer_biases & {"mlp"} if self._start is not None else frozenset()

    def recover_block(self, block: RecoveryBlock) -> str | None:
        module = block.module
        parameters = [p for p in module.parameters() if p.dtype.is_floating_point]
        if not parameters:
            return "no floating-point parameters to train"
        start = self._start.recover_block(block) if self._start is not None else None
        stored = [(p.dtype, p.requires_grad) for p in parameters]
        dtype = torch.float32 if parameters[0].dtype in _HALVES else parameters[0].dtype
        generator = torch.Generator().manual_seed(block.seed * 1_000_003 + block.index)
        try:
            for parameter in parameters:
                parameter.data = parameter.data.to(dtype)
                parameter.requires_grad_(True)
            optimizer = torch.optim.Adam(parameters, lr=self.lr)
            steps = self.epochs * block.n_batches
            with torch.enable_grad(), prunereg.keep_zeros(module, optimizer, masks=block.masks):
                order: list[int] = []
                for _ in block.progress(range(steps), label="blockwise"):
                    if not order:
                        order = torch.randperm(block.n_batches, generator=generator).tolist()
                    batch = order.pop()
                    output = block.forward(batch, dtype=dtype)
                    loss = F.mse_loss(output.float(), block.target(batch).to(output.device, torch.float32))
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
        finally:
            for parameter, (kind, flag) in zip(parameters, stored):
                parameter.data = parameter.data.to(kind)
                parameter.requires_grad_(flag)
                parameter.grad = None
        trained = f"{steps} Adam steps at lr {self.lr:g}"
        return f"{start}, then {trained}" if start else trained
