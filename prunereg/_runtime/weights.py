"""Where the decoder blocks' weights are while a block-by-block run goes over them.

A run asks its :class:`BlockWeights` to :meth:`~BlockWeights.fetch` block
``index`` before the block runs and calls :meth:`~BlockWeights.done` once the
run is through with it. :class:`InMemory` is a model already in memory;
:class:`prunereg._runtime.streamed.StreamedBlocks` reads each block from a
folder and writes it back out.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from torch import nn


class BlockWeights(Protocol):
    """Where the blocks' weights are: :meth:`fetch` fills block ``index`` before it runs, :meth:`done` after.

    :meth:`capturing` holds what the model needs outside its blocks while the first block's inputs are captured.
    """

    def capturing(self) -> contextlib.AbstractContextManager[None]: ...

    def fetch(self, index: int, block: nn.Module) -> None: ...

    def done(self, index: int, block: nn.Module, *, pruned: bool) -> None: ...


class InMemory:
    """The whole model is in memory already: nothing to fetch, nothing to write."""

    def capturing(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def fetch(self, index: int, block: nn.Module) -> None:
        pass

    def done(self, index: int, block: nn.Module, *, pruned: bool) -> None:
        pass
