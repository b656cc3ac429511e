"""``prunereg oneshot``: a Hugging Face folder in, a pruned folder that from_pretrained loads out."""

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
def folder(tmp_path):
    save_tiny_llama_folder(tmp_path / "dense")
    (tmp_path / "calibration.txt").write_text(random_text(200, seed=1))
    (tmp_path / "eval.txt").write_text(random_text(100, seed=2))
    return tmp_path


def _args(folder, *extra):
    return [
        "oneshot", str(folder / "dense"), str(folder / "pruned"), "--method", "wanda",
        "--calibration", str(folder / "calibration.txt"), "--samples", "4", "--seq-len", "32", *extra,
    ]  # fmt: skip


def _sparsity(model, name="model.layers.1.mlp.down_proj.weight"):
    return (model.get_parameter(name) == 0).float().mean().item()


def test_the_pruned_folder_loads_with_from_pretrained_and_perplexity_is_printed(folder):
    result = CliRunner().invoke(main, _args(folder, "--sparsity", "0.5", "--eval", str(folder / "eval.txt")))
    assert result.exit_code == 0, result.output
    assert "wanda: 14 layers in 2 blocks pruned to 50% (uniform)" in result.output
    assert "perplexity on eval.txt:" in result.output and "before" in result.output
    pruned = AutoModelForCausalLM.from_pretrained(folder / "pruned")
    assert _sparsity(pruned) == pytest.approx(0.5)
    assert AutoTokenizer.from_pretrained(folder / "pruned")("w1 w2").input_ids == [2, 3]


def test_json_report_pattern_and_method_options(folder):
    result = CliRunner().invoke(
        main,
        _args(
            folder, "--method", "sparsegpt", "--pattern", "2:4", "-o", "blocksize=8", "--matmul-precision", "highest",
            "--json",
        ),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["method"], report["pattern"], report["perplexity_before"]) == ("sparsegpt", "2:4", None)
    assert report["matmul_precision"] == "highest"
    assert report["n_tokens"] == 128 and len(report["layers"]) == 14
    pruned = AutoModelForCausalLM.from_pretrained(folder / "pruned")
    weight = pruned.get_parameter("model.layers.0.mlp.up_proj.weight")
    assert ((weight.reshape(-1, 4) == 0).sum(1) >= 2).all()


def test_streaming_writes_the_same_model(folder):
    streamed = CliRunner().invoke(main, _args(folder, "--stream"))
    assert streamed.exit_code == 0, streamed.output
    (folder / "pruned").rename(folder / "streamed")
    in_memory = CliRunner().invoke(main, _args(folder))
    assert in_memory.exit_code == 0, in_memory.output
    a = AutoModelForCausalLM.from_pretrained(folder / "streamed").state_dict()
    b = AutoModelForCausalLM.from_pretrained(folder / "pruned").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert (folder / "streamed" / "tokenizer.json").is_file()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--samples", "100"], "needs 3200"),
        (["--method", "l1_unstructured"], "needs a calibrated one"),
        (["--sparsity", "1.5"], "sparsity must be in [0, 1)"),
        (["-o", "nonsense"], "is not KEY=VALUE"),
        (["-o", "blocksize=8"], "blocksize"),
        (["--stream", "--dtype", "bfloat16"], "--stream keeps the checkpoint's dtype"),
        (["--matmul-precision", "low"], "'low' is not one of 'highest', 'high', 'medium'"),
    ],
)
def test_bad_arguments_give_one_line_errors_and_write_nothing(folder, extra, message):
    result = CliRunner().invoke(main, _args(folder, *extra))
    assert result.exit_code != 0
    assert message in result.output
    assert not (folder / "pruned").exists() or not any((folder / "pruned").iterdir())


def test_a_non_empty_output_folder_is_refused(folder):
    (folder / "pruned").mkdir()
    (folder / "pruned" / "keep.txt").write_text("mine")
    result = CliRunner().invoke(main, _args(folder))
    assert result.exit_code != 0 and "not empty" in result.output


@pytest.mark.slow
def test_the_command_runs_as_a_real_subprocess(folder):
    script = Path(sys.executable).with_name("prunereg")
    completed = subprocess.run(
        [str(script), *_args(folder, "--method", "magnitude", "--sparsity", "0.25")],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert "magnitude: 14 layers" in completed.stdout
    assert "magnitude model.layers: 2/2 done" in completed.stderr  # progress in a pipe: tests/cli/test_cli_progress.py
    assert _sparsity(AutoModelForCausalLM.from_pretrained(folder / "pruned")) == pytest.approx(0.25)
