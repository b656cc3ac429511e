"""The README's SmolLM2 script runs end to end, on a tiny model folder and tiny texts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from rotate_helpers import tiny_llama, token_ids
from safetensors.torch import save_file

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "slice_smollm2.py"


def test_the_slicing_script_measures_every_width(tmp_path: Path) -> None:
    model = tiny_llama()
    model.save_pretrained(tmp_path / "model")
    save_file(
        {"calibration": token_ids(4, seed=1), "evaluation": token_ids(2, seed=2)}, tmp_path / "tokens.safetensors"
    )
    spec = importlib.util.spec_from_file_location("slice_smollm2", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rows = script.main([
        "--model", str(tmp_path / "model"), "--tokens", str(tmp_path / "tokens.safetensors"),
        "--calibration", "calibration", "--evaluation", "evaluation", "--widths", "32", "24", "--threads", "1",
    ])  # fmt: skip
    assert [width for width, _, _ in rows] == [32, 32, 24]
    assert rows[1][2] == pytest.approx(rows[0][2], rel=1e-5)  # the rotation alone changes nothing
    assert rows[2][1] < 1.0 and all(torch.isfinite(torch.tensor(perplexity)) for _, _, perplexity in rows)
