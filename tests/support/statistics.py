"""Statistics of the runtime folded over plain tensors, and a module that calls one of its layers twice."""

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


class CallsItsLayerTwice(torch.nn.Module):
    """``out(shared(shared(hidden)))``: ``shared`` reads two different tensors in every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.shared, self.out = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(self.shared(self.shared(hidden)))
