"""Lottery-ticket rewinding: the kept weights go back to their values at step k after each pruning round.

The rewind point is one copy of each pruned parameter, held by the module as
the persistent buffer ``<name>_rewind`` beside ``<name>_mask``: whatever saves
the model (``state_dict``, a Lightning checkpoint, a Hugging Face Trainer
checkpoint) saves it, and loading the model restores it. Rewinding copies the
saved values into the entries the mask keeps; the pruned entries keep theirs.
What happens to the optimizer's state of those parameters is the caller's
choice: ``"keep"`` it, or ``"reset"`` it (momentum and Adam's moments start over).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from prunereg._gradual.masks import Target

SUFFIX = "_rewind"
OPTIMIZER_STATES = ("keep", "reset")


def buffer_name(target: Target) -> str:
    return target.attribute + SUFFIX


def prepare(found: Sequence[Target]) -> None:
    """Give every target its ``<name>_rewind`` buffer (the current values), unless it has one already."""
    for target in found:
        if buffer_name(target) not in target.module._buffers:
            target.module.register_buffer(buffer_name(target), target.orig().detach().clone())


def capture(found: Sequence[Target]) -> None:
    """Make the current values the rewind point."""
    with torch.no_grad():
        for target in found:
            _saved(target).copy_(target.orig())


def rewind(found: Sequence[Target], optimizers: Iterable[torch.optim.Optimizer], optimizer_state: str) -> None:
    """Put the rewind point's values back into the entries each mask keeps; reset the optimizer state if asked."""
    with torch.no_grad():
        for target in found:
            orig = target.orig()
            orig.copy_(torch.where(target.mask() != 0, _saved(target), orig))
    if optimizer_state == "reset":
        for optimizer in optimizers:
            for target in found:
                optimizer.state.pop(target.orig(), None)


def remove(found: Sequence[Target]) -> None:
    """Drop the rewind buffers: the model's state dict is as it would be without rewinding."""
    for target in found:
        target.module._buffers.pop(buffer_name(target), None)


def _saved(target: Target) -> torch.Tensor:
    saved = target.module._buffers.get(buffer_name(target))
    if saved is None:
        raise RuntimeError(f"{target.label} has no rewind point: {buffer_name(target)} was removed from its module")
    return saved
