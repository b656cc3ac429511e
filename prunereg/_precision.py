"""How precisely float32 matrix products run during the one-shot engine's calibration forwards.

The forwards only produce activations for the statistics, so they may use the
fast products torch offers (``"medium"``: bfloat16 inputs with float32 sums on
CPUs with AMX or AVX512-BF16, TF32 on GPUs). The statistics themselves, and
every method's pruning, run at ``"highest"``: full float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

#: torch's names for float32 matmul precision (``torch.set_float32_matmul_precision``).
MATMUL_PRECISIONS = ("highest", "high", "medium")


def check_matmul_precision(precision: object) -> str:
    """``precision`` if it is one of torch's float32 matmul precisions, else a one-line ValueError."""
    if precision not in MATMUL_PRECISIONS:
        choices = ", ".join(map(repr, MATMUL_PRECISIONS))
        raise ValueError(f"matmul_precision must be one of {choices}, not {precision!r}")
    assert isinstance(precision, str)
    return precision


@contextlib.contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """torch's float32 matmul precision set to ``precision`` inside the block, and restored after."""
    import torch  # here, so that the CLI reads MATMUL_PRECISIONS without importing torch

    before = torch.get_float32_matmul_precision()
    if before == precision:
        yield
        return
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
