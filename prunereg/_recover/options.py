"""The settings of recovery, spelled once: names, defaults, checks and help text.

:func:`prunereg.recover` takes these settings as keywords; every other keyword
is an option of the method (``ridge=1e-3``, ``epochs=3``), as with
:func:`prunereg.oneshot` and :func:`prunereg.shrink`. This module imports no
torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prunereg._runtime.options import (
    Options,
    blocks_setting,
    data_parallel_setting,
    matmul_precision_setting,
    progress_setting,
    setting,
)


@dataclass(frozen=True)
class RecoverOptions(Options):
    """The settings of one recovery run, checked when made (``ValueError``/``TypeError`` in one line)."""

    COMMAND = "prunereg.recover"

    removed_blocks: Sequence[int] | None = setting(
        None,
        "The teacher's blocks the model no longer has (ShrinkReport.removed_blocks) [default: found by comparing "
        "the blocks' unchanged tensors].",
        flag=None,
    )
    blocks: str | None = blocks_setting()
    batch_size: int = setting(4, "Calibration samples per forward (and per training step).", metavar="N", minimum=1)
    seed: int = setting(0, "Seed of every random draw of a training method (batch order).", metavar="N")
    matmul_precision: str = matmul_precision_setting("the least-squares statistics and solves")
    progress: bool | None = progress_setting()
    data_parallel: bool = data_parallel_setting()

    def __post_init__(self) -> None:
        if self.removed_blocks is not None:
            object.__setattr__(self, "removed_blocks", _indices(self.removed_blocks))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int, not {type(self.seed).__name__}")
        self.check_engine_settings()


def _indices(value: object) -> tuple[int, ...]:
    """``removed_blocks`` as sorted distinct block indices, or a one-line error."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"removed_blocks must be a list of block indices, not {type(value).__name__}")
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise ValueError(f"removed_blocks must hold block indices (ints >= 0), got {list(value)!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"removed_blocks names a block twice: {list(value)!r}")
    return tuple(sorted(value))
