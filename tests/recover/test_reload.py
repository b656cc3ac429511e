"""Every recovery method leaves a model that stock transformers reloads to the same logits, on every architecture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

import prunereg  # noqa: E402
from tests.recover.models import DEPTH, DEPTH_SEED, WIDTH, logits, shrunk  # noqa: E402
from tests.shrink.models import calibration_ids  # noqa: E402

#: Each method with the options that keep the test quick.
METHODS: dict[str, dict[str, Any]] = {
    "refit": {"writers": ("attention", "mlp")},  # a MoE has no dense down_proj: its o_proj is what a refit changes
    "replace": {},
    "blockwise": {"epochs": 2},
    "distill": {"max_tokens": 64},
}


@pytest.mark.parametrize("architecture", sorted(WIDTH))
@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_recovered_model_reloads_with_stock_transformers_and_gives_the_same_logits(
    architecture: str, method: str, tmp_path: Path
) -> None:
    if method == "replace":
        model, teacher = shrunk(architecture, *DEPTH, seed=DEPTH_SEED[architecture])
    else:
        model, teacher = shrunk(architecture, *WIDTH[architecture])
    report = prunereg.recover(model, teacher, calibration_ids(), method, **METHODS[method], progress=False)
    assert any(step.changed for step in report.steps) or report.undone, str(report)
    ids = calibration_ids(2, 12, seed=7)
    expected = logits(model, ids)
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(reloaded, ids), expected, rtol=0, atol=0)
    assert sum(p.numel() for p in reloaded.parameters()) == sum(p.numel() for p in model.parameters())
