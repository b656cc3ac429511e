"""How precisely float32 matrix products run during the one-shot engine's calibration forwards.

The forwards only produce activations for the statistics, so they may use the
fast products torch offers (``"medium"``: bfloat16 inputs with float32 sums on
CPUs with AMX or AVX512-BF16, TF32 on GPUs). The statistics themselves, and
every method's pruning, run at ``"highest"``: full float32.

torch keeps the setting per backend (``torch.backends.cuda.matmul`` and
``torch.backends.mkldnn.matmul``, each with its ``fp32_precision``); the legacy
``torch.set_float32_matmul_precision`` names map onto pairs of those. Saving and
restoring the per-backend values leaves a caller's setting exactly as it was,
whichever of torch's two interfaces set it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: torch's names for float32 matmul precision (``torch.set_float32_matmul_precision``).
MATMUL_PRECISIONS = ("highest", "high", "medium")

#: Each name as torch's own setter maps it: (CUDA matmul, oneDNN matmul) ``fp32_precision``.
_PER_BACKEND = {"highest": ("ieee", "ieee"), "high": ("tf32", "tf32"), "medium": ("tf32", "bf16")}


def check_matmul_precision(precision: object) -> str:
    """``precision`` if it is one of torch's float32 matmul precisions, else a one-line TypeError or ValueError."""
    if not isinstance(precision, str):
        raise TypeError(f"matmul_precision must be a string, not {type(precision).__name__}")
    if precision not in MATMUL_PRECISIONS:
        choices = ", ".join(map(repr, MATMUL_PRECISIONS))
        raise ValueError(f"matmul_precision must be one of {choices}, not {precision!r}")
    return precision


@contextlib.contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """torch's float32 matmul precision set to ``precision`` inside the block, and restored after."""
    import torch  # here, so that the CLI reads MATMUL_PRECISIONS without importing torch

    backends = _matmul_backends(torch)
    if backends is None:  # a torch without per-backend settings (before 2.9): only the legacy one exists
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(precision)
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(before)
        return
    saved = [backend.fp32_precision for backend in backends]
    for backend, value in zip(backends, _PER_BACKEND[precision], strict=True):
        backend.fp32_precision = value
    try:
        yield
    finally:
        for backend, value in zip(backends, saved, strict=True):
            backend.fp32_precision = value


def _matmul_backends(torch: Any) -> list[Any] | None:
    """torch's CUDA and oneDNN matmul settings objects, or None if this torch keeps only the legacy setting."""
    backends = [torch.backends.cuda.matmul, torch.backends.mkldnn.matmul]
    return backends if all(hasattr(backend, "fp32_precision") for backend in backends) else None
