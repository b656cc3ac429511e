"""benchmarks/llm_engine.py: its reference-style loops prune what the engine prunes, so its timings compare alike."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

import prunereg

pytest.importorskip("transformers")

from tests.support.tiny_lm import calibration_ids, tiny_llama

sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))

import llm_engine  # benchmarks/ is not a package: found through sys.path


def _masks(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p == 0 for n, p in model.named_parameters() if n.endswith("_proj.weight")}


def test_the_wanda_loop_prunes_exactly_what_oneshot_prunes_at_highest_precision():
    dense, ids = tiny_llama(layers=2), calibration_ids(6, 16)
    loop, engine = copy.deepcopy(dense), copy.deepcopy(dense)
    llm_engine.reference_style_loop(loop, ids, *llm_engine.REFERENCES["wanda"])
    prunereg.oneshot(engine, "wanda", calibration=ids, sparsity=0.5, matmul_precision="highest")
    expected = _masks(engine)
    for name, mask in _masks(loop).items():
        assert torch.equal(mask, expected[name]), name


def test_the_sparsegpt_loop_is_the_papers_algorithm_up_to_its_threshold_rule():
    dense, ids = tiny_llama(layers=2), calibration_ids(6, 16)
    loop, engine = copy.deepcopy(dense), copy.deepcopy(dense)
    llm_engine.reference_style_loop(loop, ids, *llm_engine.REFERENCES["sparsegpt"])
    prunereg.oneshot(engine, "sparsegpt", calibration=ids, sparsity=0.5, matmul_precision="highest")
    expected, masks = _masks(engine), _masks(loop)
    agreeing = sum(int((masks[n] == expected[n]).sum()) for n in masks) / sum(m.numel() for m in masks.values())
    assert agreeing > 0.9
    # The reference's `<=` threshold prunes one weight more per column block than round(sparsity * n).
    for name, mask in masks.items():
        assert int(mask.sum()) >= int(expected[name].sum()), name
