"""``refit``: each block's writer projections solved by damped least squares to match the dense block's output.

The closed form of recovery, no training: for each block in turn, the
attention's ``o_proj`` is solved so that the residual stream after attention
matches the dense block's, then the MLP's ``down_proj`` (on the inputs the
refit attention now gives) so that the block's output matches the dense
block's, each with its bias where the model has one or its config can switch
one on. The structured form of SparseGPT's weight update; FLAP's bias
compensation is its special case that solves for the bias alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from prunereg import RecoveryBlock, RecoveryMethod
from prunereg_recover.least_squares import damped_solution
from prunereg_recover.writing import kept_entries, linear_bias, linear_weight, write

KINDS = ("attention", "mlp")  # the order of the refits: the MLP reads what the attention writes
#: The default: each part's writer where the part is no longer the dense one, the MLP's too before removed blocks.
AUTO = "auto"
_NAMES = {"attention": "o_proj", "mlp": "down_proj"}


class Refit(RecoveryMethod):
    """Refit ``o_proj`` and ``down_proj`` (with their biases) by damped least squares, block by block.

    For each writer, ``min ||[X 1] [W^T; b] - R||^2 + lambda ||W||^2`` over the
    calibration tokens, ``X`` its inputs along the recovered model's trajectory,
    ``R`` what it must write for the block to give the dense model's output,
    from float64 normal equations; ``lambda = ridge * mean(diag(X^T X))`` and
    the intercept, undamped, becomes the bias. ``writers`` picks the
    projections (``"attention"``, ``"mlp"``); ``"auto"`` (the default) refits
    a part's writer only where the part is no longer the dense model's
    (narrowed or pruned), and the MLP's where the block stands for removed
    blocks too. Refitting a part that is still the dense one, to make up for
    what changed around it, measured worse on held-out text on SmolLM2: the
    attention's at FLAP mlp 0.5 (Hamlet 81.6 against 79.5), the MLP's at heads
    1/3 (58.4 against 56.3), and in every block after dropping 4 and 8 (63.9
    and 80.9 against 61.3 and 78.8). ``bias=False`` switches no bias on (a bias
    the model has is refit all the same). On a masked model each row is solved
    over its kept weights only: every zero stays zero.
    """

    STATISTICS = frozenset({"attention_residual"})
    DATA_PARALLEL = True  # it reads the batches through the block's normal equations and losses only

    def __init__(self, ridge: float = 1e-4, writers: str | Sequence[str] = AUTO, bias: bool = True) -> None:
        if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or not ridge >= 0:
            raise ValueError(f"ridge must be a number >= 0, not {ridge!r}")
        self.auto = writers == AUTO
        if isinstance(writers, str):
            writers = KINDS if self.auto else (writers,)
        unknown = [kind for kind in writers if kind not in KINDS]
        if unknown or not writers:
            raise ValueError(f"writers must name some of {', '.join(KINDS)}, not {list(writers)!r}")
        if not isinstance(bias, bool):
            raise TypeError(f"bias must be True or False, not {bias!r}")
        self.ridge = float(ridge)
        self.writers = tuple(kind for kind in KINDS if kind in writers)
        self.bias = bias

    def __repr__(self) -> str:
        writers = repr(AUTO) if self.auto else repr(self.writers)
        return f"Refit(ridge={self.ridge:g}, writers={writers}, bias={self.bias})"

    def reads_attention_residual(self, changed: frozenset[str]) -> bool:
        return "attention" in self.writers and (not self.auto or "attention" in changed)

    @property
    def writer_biases(self) -> frozenset[str]:
        return frozenset(self.writers) if self.bias else frozenset()

    def recover_block(self, block: RecoveryBlock) -> str | None:
        done, missing = [], []
        for kind in self.writers:
            if self.auto and not _refit_by_default(kind, block):
                continue  # the dense model's part on moved inputs: refitting it measured worse (above)
            writer = block.writer(kind)
            if writer is None:
                missing.append(_NAMES[kind])
                continue
            weight = linear_weight(writer)
            bias = linear_bias(writer)  # an existing bias is refit in any case: the fit must account for it
            solved, intercept = damped_solution(
                block.normal_equations(kind),
                ridge=self.ridge,
                intercept=bias is not None,
                kept=kept_entries(block, weight),
                spread=block.solve_spread,
            )
            write(weight, solved)
            if bias is not None and intercept is not None:
                write(bias, intercept)
            done.append(_NAMES[kind] + (" and bias" if bias is not None else ""))
        notes = [f"refit {', '.join(done)}"] if done else []
        if missing:
            notes.append(f"no {' or '.join(missing)} that writes into the residual stream as it is")
        return "; ".join(notes)


def _refit_by_default(kind: str, block: RecoveryBlock) -> bool:
    """Whether ``"auto"`` refits ``kind``'s writer in ``block``: where the part is no longer the dense model's, and
    the MLP's where the block stands for removed blocks too (nothing else can take on what they added)."""
    return kind in block.changed or (kind == "mlp" and block.removed_after > 0)
