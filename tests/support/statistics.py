"""Statistics of the runtime folded over plain tensors, as the recorder folds a layer's inputs."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from prunereg.toolkit import Observation, Statistic


def folded(statistic: type[Statistic], batches: Iterable[torch.Tensor]) -> Statistic:
    """A new ``statistic`` with each of ``batches`` (a layer's inputs, ``[..., features]``) folded in, in order."""
    made = statistic()
    for index, batch in enumerate(batches):
        made.fold(Observation(index, batch))
    return made
