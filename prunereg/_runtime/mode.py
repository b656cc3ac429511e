"""How a block-by-block run treats the model it runs: eval mode without autograd, on the device of its inputs.

The run puts every module in eval mode and turns autograd off, and gives each
module its own train/eval flag back after (:func:`calibration_mode`; a run
that needs autograd, slimming's, takes :func:`eval_mode` alone); its
calibration ids go where the model reads them (:func:`input_device`). A model
pruned with torch's reparametrization is refused (:func:`check_not_reparametrized`),
and :func:`copy_fits` says whether a copy of some weights fits in host memory
(a run that can put its model back keeps one).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch import nn

from prunereg._core.reparam import is_pruned


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode inside the block (dropout off, norms on their running statistics); each module's own flag after."""
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, training in modes.items():
            module.training = training


@contextlib.contextmanager
def calibration_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode and no autograd for the run; each module's own train/eval flag restored after."""
    with eval_mode(model), torch.no_grad():
        yield


def check_not_reparametrized(model: nn.Module) -> None:
    """Refuse a model whose pruning is not permanent yet (``weight_orig``/``weight_mask``): a one-line ValueError."""
    if is_pruned(model):
        raise ValueError("the model is already pruned (reparametrized); make that permanent with prunereg.remove first")


def input_device(model: nn.Module) -> torch.device:
    """Where the model reads its token ids: its input embeddings' device (else its first parameter's, else the CPU)."""
    get_input_embeddings = getattr(model, "get_input_embeddings", None)
    embeddings = get_input_embeddings() if callable(get_input_embeddings) else None
    if isinstance(embeddings, nn.Module):
        for parameter in embeddings.parameters():
            return parameter.device
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def copy_fits(n_bytes: int) -> bool:
    """Whether a copy of ``n_bytes`` takes at most half the host memory available now (``True`` if unknown)."""
    available = available_memory()
    return available is None or n_bytes <= available // 2


def available_memory() -> int | None:
    """The host memory available to new allocations, in bytes, where the system says."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            line = next(line for line in meminfo if line.startswith("MemAvailable:"))
        return int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None
