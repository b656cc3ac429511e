"""The calibration set as the first decoder block sees it, and running a block on it.

The model runs each calibration batch only up to its first block: a forward
pre-hook stores what the block is called with (hidden states, attention mask,
position embeddings, ...) and stops the forward. From then on the engine feeds
the blocks itself, one after the other, reusing the captured arguments.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn


class _FirstBlockReached(Exception):
    """Raised by the capture hook to stop the model's forward at the first block."""


class RestNotNeeded(Exception):
    """Raised by a statistics hook once a block's forward has given what is gathered: the rest is skipped.

    A pass that only gathers statistics (its outputs feed nothing) need not run
    the products after the last hooked layer's input: the down projection of an
    MLP, say. :func:`call_block_for_statistics` catches it.
    """


@dataclass
class BlockInputs:
    """Per calibration batch: the hidden states a block reads and the other arguments it is called with.

    ``first`` is the index of the first of these batches in the whole
    calibration set (a rank holds a contiguous range of it).
    """

    hidden: list[Tensor] = field(default_factory=list)
    args: list[tuple[Any, ...]] = field(default_factory=list)
    kwargs: list[dict[str, Any]] = field(default_factory=list)
    first: int = 0

    def __len__(self) -> int:
        return len(self.hidden)


def capture_first_block_inputs(
    model: nn.Module, first_block: nn.Module, batches: Iterable[Tensor], first: int = 0
) -> BlockInputs:
    """Run each batch of token ids through ``model`` up to ``first_block`` and keep the block's arguments.

    ``first``: the index of the first of ``batches`` in the whole calibration set.
    """
    captured = BlockInputs(first=first)

    def store(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden, *rest = args if args else (kwargs.pop("hidden_states"),)
        captured.hidden.append(hidden.detach())
        captured.args.append(tuple(rest))
        captured.kwargs.append(dict(kwargs))
        raise _FirstBlockReached

    # Hugging Face models would otherwise build a key/value cache the engine never reads.
    options = {"use_cache": False} if hasattr(getattr(model, "config", None), "use_cache") else {}
    handle = first_block.register_forward_pre_hook(store, with_kwargs=True)
    try:
        for batch in batches:
            try:
                model(batch, **options)
            except _FirstBlockReached:
                continue
            raise RuntimeError(f"{type(model).__name__}'s forward never called its first decoder block")
    finally:
        handle.remove()
    return captured


def call_block(block: nn.Module, inputs: BlockInputs, batch: int) -> Tensor:
    """The block's output hidden states for calibration batch ``batch``."""
    output = block(inputs.hidden[batch], *inputs.args[batch], **inputs.kwargs[batch])
    return output[0] if isinstance(output, (tuple, list)) else output


def call_block_for_statistics(block: nn.Module, inputs: BlockInputs, batch: int) -> Tensor | None:
    """The block's output for batch ``batch``, or None where a hook stopped the forward with :class:`RestNotNeeded`."""
    with contextlib.suppress(RestNotNeeded):
        return call_block(block, inputs, batch)
    return None


def advance(block: nn.Module, inputs: BlockInputs) -> None:
    """Turn ``inputs`` into the next block's: each batch's hidden states become this block's output.

    In place, batch by batch, so that one set of activations (and one batch's
    output) is alive at a time, not the block's inputs and outputs both.
    """
    for batch in range(len(inputs)):
        inputs.hidden[batch] = call_block(block, inputs, batch)


def batches_of(calibration: Tensor | Iterable[Tensor], batch_size: int, device: torch.device) -> Iterator[Tensor]:
    """Calibration token ids as ``[batch, seq_len]`` LongTensors on ``device``.

    A ``[n_samples, seq_len]`` tensor is cut into batches of ``batch_size`` rows;
    an iterable yields its own batches (each ``[batch, seq_len]`` or ``[seq_len]``).
    """
    if isinstance(calibration, Tensor):
        tensor = check_token_ids(calibration)
        for start in range(0, tensor.shape[0], batch_size):
            yield tensor[start : start + batch_size].to(device)
        return
    for batch in calibration:
        yield check_token_ids(batch).to(device)


def check_token_ids(ids: object) -> Tensor:
    """``ids`` as a 2-D integer tensor ``[batch, seq_len]``, or a clear error."""
    if not isinstance(ids, Tensor):
        raise TypeError(
            f"calibration must be a LongTensor of token ids or an iterable of them, not {type(ids).__name__}"
        )
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"calibration token ids must be an integer tensor, not {ids.dtype}")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.numel() == 0:
        raise ValueError(f"calibration token ids must be [n_samples, seq_len], got shape {tuple(ids.shape)}")
    return ids
