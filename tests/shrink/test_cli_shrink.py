"""``prunereg shrink``: a Hugging Face folder in, a smaller folder that stock from_pretrained loads out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from prunereg._cli import main

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.support.tiny_lm import random_text, save_tiny_llama_folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    save_tiny_llama_folder(tmp_path / "dense")
    (tmp_path / "calibration.txt").write_text(random_text(200, seed=1))
    (tmp_path / "eval.txt").write_text(random_text(100, seed=2))
    return tmp_path


def _args(folder: Path, *extra: str) -> list[str]:
    return [
        "shrink", str(folder / "dense"), str(folder / "small"), "--method", "flap", "--calibration",
        str(folder / "calibration.txt"), "--samples", "4", "--seq-len", "32", *extra,
    ]  # fmt: skip


def test_the_shrunk_folder_loads_with_stock_from_pretrained_and_perplexity_is_printed(folder: Path) -> None:
    result = CliRunner().invoke(
        main, _args(folder, "--mlp", "0.5", "--heads", "0.5", "--eval", str(folder / "eval.txt"))
    )
    assert result.exit_code == 0, result.output
    assert "flap:" in result.output and "MLP CHANNELS" in result.output
    assert "perplexity on eval.txt:" in result.output and "after" in result.output
    dense = AutoModelForCausalLM.from_pretrained(folder / "dense")
    small = AutoModelForCausalLM.from_pretrained(folder / "small")
    assert small.config.intermediate_size == dense.config.intermediate_size // 2
    assert small.config.num_key_value_heads == dense.config.num_key_value_heads // 2
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in dense.parameters())
    assert AutoTokenizer.from_pretrained(folder / "small")("w1 w2").input_ids == [2, 3]


def test_the_json_report_has_the_parameters_and_perplexities(folder: Path) -> None:
    args = _args(folder, "-m", "block_influence", "--layers", "1", "--eval", str(folder / "eval.txt"), "--json")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["removed_blocks"]) == 1 and data["params_after"] < data["params_before"]
    assert data["perplexity_after"] > 0 and data["perplexity_before"] > 0
    assert AutoModelForCausalLM.from_pretrained(folder / "small").config.num_hidden_layers == 1


def test_magnitude_sp_runs_without_a_calibration_file(folder: Path) -> None:
    args = ["shrink", str(folder / "dense"), str(folder / "small"), "-m", "magnitude_sp", "--mlp", "0.25"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    small = AutoModelForCausalLM.from_pretrained(folder / "small")
    with torch.no_grad():
        assert torch.isfinite(small(torch.tensor([[1, 2, 3]])).logits).all()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--mlp", "0.999"], "would leave no channel"),
        (["--mlp", "1.5"], "mlp must be in [0, 1)"),
        ([], "nothing to remove"),
        (["--mlp", "0.5", "-m", "wanda"], "shrink needs one of kind shrink"),
        (["--mlp", "0.5", "-o", "heads=0.5"], "-o heads: heads is shrink's own setting"),
        (["--mlp", "0.5", "-o", "compensate=2"], "compensate must be True or False"),
        (["--mlp", "0.5", "--samples", "100"], "needs 3200"),
    ],
)
def test_bad_arguments_give_one_line_errors_and_write_nothing(folder: Path, extra: list[str], message: str) -> None:
    result = CliRunner().invoke(main, _args(folder, *extra))
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output
    assert not (folder / "small").exists() or not any((folder / "small").iterdir())


def test_a_non_empty_output_folder_is_refused_and_force_replaces_it(folder: Path) -> None:
    (folder / "small").mkdir()
    (folder / "small" / "keep.txt").write_text("mine")
    result = CliRunner().invoke(main, _args(folder, "--mlp", "0.5"))
    assert result.exit_code != 0 and "not empty" in result.output
    assert (folder / "small" / "keep.txt").read_text() == "mine"
    result = CliRunner().invoke(main, _args(folder, "--mlp", "0.5", "--force"))
    assert result.exit_code == 0, result.output
    assert not (folder / "small" / "keep.txt").exists() and (folder / "small" / "config.json").is_file()


def test_the_output_may_not_be_the_model_folder(folder: Path) -> None:
    args = [*_args(folder, "--mlp", "0.5", "--force")]
    args[2] = str(folder / "dense")
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and "MODEL_DIR" in result.output
    assert AutoModelForCausalLM.from_pretrained(folder / "dense").config.intermediate_size == 48


@pytest.mark.slow
def test_the_command_runs_as_a_real_subprocess(folder: Path) -> None:
    script = Path(sys.executable).with_name("prunereg")
    completed = subprocess.run(
        [str(script), *_args(folder, "-m", "wanda_sp", "--mlp", "0.25")],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert "wanda_sp:" in completed.stdout and "wrote" in completed.stdout
    assert "wanda_sp model.layers: 2/2 done" in completed.stderr  # progress in a pipe: tests/cli/test_cli_progress.py
    assert AutoModelForCausalLM.from_pretrained(folder / "small").config.intermediate_size == 36


def test_streaming_writes_the_same_model(folder: Path) -> None:
    assert CliRunner().invoke(main, _args(folder, "--mlp", "0.5", "--heads", "0.5")).exit_code == 0
    args = _args(folder, "--mlp", "0.5", "--heads", "0.5", "--stream", "--eval", str(folder / "eval.txt"))
    args[2] = str(folder / "streamed")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "perplexity on eval.txt:" in result.output
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        in_memory = AutoModelForCausalLM.from_pretrained(folder / "small")(ids).logits
        streamed = AutoModelForCausalLM.from_pretrained(folder / "streamed")(ids).logits
    assert torch.equal(in_memory, streamed)
    assert (folder / "streamed" / "tokenizer.json").is_file()


def test_stream_refuses_a_dtype(folder: Path) -> None:
    result = CliRunner().invoke(main, _args(folder, "--mlp", "0.5", "--stream", "--dtype", "bfloat16"))
    assert result.exit_code != 0 and "--stream keeps the checkpoint's dtype" in result.output
