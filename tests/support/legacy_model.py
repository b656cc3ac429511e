"""The model pickled whole by prunereg 0.1 (commit 8d48cee) in ``tests/data/pruned_model_8d48cee.pt``.

The pickle names this class as ``tests.support.legacy_model.Net``; keep it where it is.
"""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    """Two Linear layers and an attention: pruned by a container, a global pruning and a refresh hook."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 4)
        self.attention = nn.MultiheadAttention(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(torch.relu(self.fc1(x)))
        return self.attention(h, h, h)[0]


def prune_as_written(net: Net) -> None:
    """What was done to the pickled model, with prunereg 0.1's ``prunereg.prune``."""
    import prunereg.prune as prune

    prune.l1_unstructured(net.fc1, "weight", amount=0.25)
    prune.ln_structured(net.fc1, "weight", amount=1, n=2, dim=0)
    prune.global_unstructured([(net.fc2, "weight"), (net.fc1, "bias")], prune.L1Unstructured, amount=0.3)
    prune.random_unstructured(net.attention, "out_proj.weight", amount=0.5)
