"""Removal cuts the right entries: a shrunk model computes what the dense one does with the removed units silenced.

Reloading checks that shapes and config agree; this checks that the rows and
columns cut together belong together (a head's query rows with its key/value
rows and output columns, Phi-3's stacked projections, GPT-2's and OPT's layouts).
Silencing a unit means zeroing its output projection's columns: its contribution
is then exactly nothing, so the dense model must give the shrunk model's logits.
"""

from __future__ import annotations

from typing import Any

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import prunereg  # noqa: E402
from prunereg._runtime.blocks import weight_matrix  # noqa: E402
from prunereg._runtime.parts import find_heads, find_mlp  # noqa: E402
from tests.shrink.models import build, calibration_ids  # noqa: E402


def _shuffled(n: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(n)).float()


class _Shuffled(prunereg.ShrinkMethod):
    """Scores that pick units all over the place, the same for the test to recompute."""

    TARGETS = frozenset({"channels"})

    def channel_scores(self, weight: torch.Tensor, statistics: prunereg.ChannelStatistics) -> torch.Tensor:
        return _shuffled(weight.shape[1])


def _silence(model: nn.Module, kind: str, share: float) -> None:
    """Zero the output-projection columns of the units ``_Shuffled`` removes, in every block (in place)."""
    for block in model.get_submodule(_blocks_path(model)):
        group = (find_mlp if kind == "mlp" else find_heads)(block, model.config)
        assert not isinstance(group, str)
        width = group.channels_per_unit
        scores = _shuffled(group.n_units * width).reshape(group.n_units, width).sum(dim=1)
        removed = torch.sort(scores, descending=True, stable=True).indices[
            group.n_units - round(share * group.n_units) :
        ]
        with torch.no_grad():
            columns = weight_matrix(group.writer)
            for unit in removed.tolist():
                columns[:, unit * width : (unit + 1) * width] = 0


def _blocks_path(model: nn.Module) -> str:
    from prunereg._runtime.blocks import find_blocks

    return find_blocks(model)[0]


CASES = [
    *[(arch, {"mlp": 0.5}) for arch in ("llama", "qwen2", "mistral", "phi3", "gpt2", "opt")],
    *[(arch, {"heads": 0.5}) for arch in ("llama", "qwen2", "phi3", "mixtral")],
]


@pytest.mark.parametrize(("architecture", "options"), CASES, ids=lambda v: str(v))
def test_a_shrunk_model_computes_what_the_dense_one_does_with_the_removed_units_silenced(
    architecture: str, options: dict[str, Any]
) -> None:
    [(kind, share)] = options.items()
    silenced, shrunk = build(architecture), build(architecture)
    _silence(silenced, kind, share)
    prunereg.shrink(shrunk, _Shuffled(), **options)
    ids = calibration_ids(2, 12, seed=7)
    with torch.no_grad():
        torch.testing.assert_close(shrunk(ids).logits, silenced(ids).logits, rtol=1e-5, atol=1e-5)
