"""The blocks of an FSDP2-sharded model, gathered one at a time for a block-by-block run and resharded after.

:class:`ShardedBlocks` is the :class:`~prunereg._runtime.weights.BlockWeights`
of a model whose parameters are DTensors: :meth:`~ShardedBlocks.fetch` gathers
a block's parameters whole on every rank (one collective per parameter, after
one exchange that stops every rank if one failed), the run calibrates and
prunes it as plain tensors, and :meth:`~ShardedBlocks.done` writes the result
into each rank's own shards and drops the whole copy (with ``permanent=False``,
each layer's mask then goes onto its sharded weight, cut into the same
shards). A rank holds its shards,
one whole block and its calibration activations at a time; the rest of the
model (embeddings, final norm, head) is gathered only while the first block's
inputs are captured. FSDP2's own forward hooks stay set aside for the run
(:func:`sharded_run`), so no forward of a rank's share of the data is a collective.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from torch import Tensor, nn

from prunereg._core import reparam
from prunereg._core.custom import CustomFromMask
from prunereg._distributed.gathered import (
    Gathered,
    check_gatherable,
    fsdp_hooks_set_aside,
    gather,
    is_sharded,
)
from prunereg._runtime.ranks import Ranks
from prunereg._runtime.weights import BlockWeights, InMemory


class ShardedBlocks:
    """Each block's sharded parameters gathered whole when fetched, written back into the shards when done."""

    def __init__(self, model: nn.Module, blocks: Iterable[nn.Module], ranks: Ranks):
        self.model = model
        self.blocks = list(blocks)
        self.ranks = ranks
        self.gathered: Gathered | None = None

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """The parameters outside the blocks gathered while the first block's inputs are captured."""
        self.ranks.exchange(None)  # a rank that failed stops every rank here, before the gathers
        outside = gather(self.model, skip=self.blocks)
        try:
            yield
        finally:
            outside.release(write_back=False)

    def fetch(self, index: int, block: nn.Module) -> None:
        self.ranks.exchange(None)
        self.gathered = gather(block)

    def done(self, index: int, block: nn.Module, *, pruned: bool) -> None:
        masks = _masks_taken_off(block) if pruned else []
        self.close(write_back=pruned)
        for module, name, mask in masks:  # each rank cuts its own shards of the mask, as of the weights
            CustomFromMask.apply(module, name, mask)

    def close(self, *, write_back: bool = True) -> None:
        """Put back the sharded parameters of the block still gathered, if any (with its values, by default)."""
        if self.gathered is not None:
            self.gathered.release(write_back=write_back)
            self.gathered = None


def _masks_taken_off(block: nn.Module) -> list[tuple[nn.Module, str, Tensor]]:
    """Every pruning reparametrization of ``block`` (``permanent=False``) made permanent: its module, name and mask.

    The whole parameter then holds the pruned values again, to be written into
    the shards, and the mask goes back on the sharded parameter after.
    """
    masks = []
    for module in block.modules():
        for key in [key for key in module._parameters if key.endswith("_orig")]:
            name = key[: -len("_orig")]
            hooks = reparam.pruning_hooks(module, name)
            mask = module._buffers.get(f"{name}_mask")
            if hooks and mask is not None:
                masks.append((module, name, mask))
                reparam.remove(module, name, hooks)
    return masks


def check_sharded_run(model: nn.Module, what: str, ranks: Ranks | None) -> None:
    """Refuse, in one line, a sharded ``model`` that a block-by-block run cannot gather; a plain one passes.

    ``ranks`` is None when the run does not calibrate across ranks: then each
    rank's result would differ while the shards must hold one model's.
    """
    if not is_sharded(model):
        return
    if ranks is None:
        raise ValueError(
            f"{what}: the model is sharded (DTensor parameters), so every rank must calibrate together: "
            "leave data_parallel at True"
        )
    check_gatherable(model, what)


def refuse_sharded(model: nn.Module, message: str) -> None:
    """Refuse a sharded ``model`` (DTensor parameters) with ``message``, one line that says what to do instead."""
    if is_sharded(model):
        raise NotImplementedError(message)


@contextlib.contextmanager
def sharded_run(model: nn.Module, blocks: Iterable[nn.Module], ranks: Ranks | None) -> Iterator[BlockWeights]:
    """The run's :class:`BlockWeights`: :class:`ShardedBlocks` for a sharded model, :class:`InMemory` otherwise.

    Check the model with :func:`check_sharded_run` first. On the way out, a
    block still gathered (a run that raised) has its values written back.
    """
    if ranks is None or not is_sharded(model):
        yield InMemory()
        return
    sharded = ShardedBlocks(model, blocks, ranks)
    with fsdp_hooks_set_aside(model):
        try:
            yield sharded
        finally:
            sharded.close()
