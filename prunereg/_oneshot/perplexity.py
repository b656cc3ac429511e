"""Perplexity of a causal language model on a text, to measure what pruning cost."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional

from prunereg._runtime.calibration import check_fits_model
from prunereg._runtime.mode import calibration_mode

#: Positions whose loss is computed in one step (a ``POSITIONS_PER_STEP x vocabulary`` buffer).
POSITIONS_PER_STEP = 128


def perplexity(model: nn.Module, ids: Tensor, *, window: int = 512, batch_size: int = 1) -> float:
    """``exp`` of the mean next-token negative log-likelihood over non-overlapping windows of ``ids``.

    ``ids`` are the token ids of one text (``[n_tokens]`` or ``[1, n_tokens]``;
    the rows of a ``[n, length]`` tensor are read one after the other). The text
    is cut into windows of ``window`` tokens, the last one possibly shorter; each
    window is read on its own, so its first token is never predicted. This is
    how the Wanda and SparseGPT papers measure perplexity: with a token count that
    is a multiple of ``window`` the figures are the same. ``batch_size`` windows
    run at once (their logits, ``window x vocabulary`` floats each, dominate the
    memory). ``model(ids)`` must return an object with ``.logits`` (Hugging Face)
    or the logits themselves. A model whose outputs hold NaN gives NaN; one
    whose mean loss exceeds what a float can exponentiate gives ``inf``.
    """
    if not isinstance(ids, Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise TypeError("ids must be an integer tensor of token ids")
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ValueError(f"window must be an int >= 2, got {window!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    tokens = ids.reshape(-1)
    if tokens.numel() < 2:
        raise ValueError("ids must hold at least 2 tokens")
    windows = [w for w in tokens.split(window) if w.numel() >= 2]
    check_fits_model(model, windows, what="the windows of ids", hint="pass a smaller window")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    total_nll, predicted = 0.0, 0
    with calibration_mode(model):  # eval mode without autograd, each module's own flag restored after
        for start in range(0, len(windows), batch_size):
            for batch in _same_length_batches(windows[start : start + batch_size]):
                nll, count = _window_nll(model, batch.to(device))
                total_nll += nll
                predicted += count
    try:
        return math.exp(total_nll / predicted)
    except OverflowError:  # a mean loss above ~709 nats: larger than any float
        return math.inf


def _same_length_batches(windows: list[Tensor]) -> list[Tensor]:
    """Stack the windows; a shorter last window goes in a batch of its own."""
    full = [w for w in windows if w.numel() == windows[0].numel()]
    rest = [w.unsqueeze(0) for w in windows[len(full) :]]
    return [torch.stack(full), *rest]


def _window_nll(model: nn.Module, batch: Tensor) -> tuple[float, int]:
    """Summed next-token NLL of a ``[batch, length]`` window batch, and how many tokens it predicted.

    The loss is taken over contiguous row blocks of :data:`POSITIONS_PER_STEP`
    positions of one window at a time: its ``log_softmax`` then needs a small
    buffer, not another copy of the whole batch's logits.
    """
    output = model(batch)
    logits = getattr(output, "logits", output)
    total = 0.0
    for window_logits, window in zip(logits, batch, strict=True):
        predictions, targets = window_logits[:-1], window[1:]  # [positions, vocabulary]: contiguous views
        for rows, labels in zip(predictions.split(POSITIONS_PER_STEP), targets.split(POSITIONS_PER_STEP), strict=True):
            total += functional.cross_entropy(rows.float(), labels, reduction="sum").item()
    return total, batch[:, 1:].numel()
