"""``prunereg slim`` on Hugging Face folders: in process through CliRunner, and once as the installed command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import prunereg
from prunereg._cli import main
from tests.slim.helpers import outputs
from tests.support import slim_models
from tests.support.fifos import fifo_unblocker

pytest.importorskip("transformers")

SCRIPT = Path(sys.executable).with_name("prunereg")


def _beside_the_hint(stderr: str) -> str:
    """stderr less the line on a language model's folder that says shrink is the tool (issue 32 item 4)."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith("note: MODEL_DIR holds a"))


def _folder(tmp_path: Path, build=slim_models.hf_smollm2_llama) -> tuple[Path, torch.nn.Module]:  # type: ignore[no-untyped-def]
    model, _ = build()
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    return folder, model


def test_slim_writes_a_folder_stock_from_pretrained_loads_and_prints_the_report(tmp_path: Path) -> None:
    folder, model = _folder(tmp_path)
    result = CliRunner().invoke(main, ["slim", str(folder), str(tmp_path / "out"), "--ratio", "0.5"])
    assert result.exit_code == 0, result.output
    assert "parameters" in result.output and "MACs" in result.output and "wrote" in result.output
    reloaded = type(model).from_pretrained(tmp_path / "out")
    assert reloaded.config.num_attention_heads == 2
    assert sum(p.numel() for p in reloaded.parameters()) < sum(p.numel() for p in model.parameters())


def test_off_a_terminal_slim_draws_no_bar_for_the_weights_it_writes(tmp_path: Path) -> None:
    """transformers' "Writing model shards" bar went to a log or a pipe as a line of carriage returns."""
    folder, _ = _folder(tmp_path)
    result = CliRunner().invoke(main, ["slim", str(folder), str(tmp_path / "out"), "--ratio", "0.5"])
    assert result.exit_code == 0, result.output
    assert _beside_the_hint(result.stderr) == ""


def test_slim_json_gives_the_report_as_data(tmp_path: Path) -> None:
    folder, _ = _folder(tmp_path, slim_models.hf_vit)
    result = CliRunner().invoke(main, ["slim", str(folder), str(tmp_path / "out"), "--ratio", "0.25", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ratio"] == 0.25 and report["params_after"] < report["params_before"] and report["changes"]


def test_slim_without_ratio_removes_the_channels_the_folders_masks_pruned(tmp_path: Path) -> None:
    model, inputs = slim_models.hf_smollm2_llama()
    rows = torch.ones(model.config.intermediate_size, 1)
    rows[::2] = 0  # half of layer 0's MLP channels, in both of the projections that make them
    mlp = model.model.layers[0].mlp
    for layer in (mlp.gate_proj, mlp.up_proj):
        prunereg.get("custom_from_mask").apply(layer, "weight", mask=rows.expand_as(layer.weight).clone())
    masked = outputs(model, inputs)
    prunereg.save_pretrained(model, tmp_path / "pruned")
    result = CliRunner().invoke(main, ["slim", str(tmp_path / "pruned"), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    reloaded = prunereg.from_pretrained(type(model), tmp_path / "out")
    assert reloaded.model.layers[0].mlp.gate_proj.out_features == model.config.intermediate_size // 2
    assert reloaded.model.layers[1].mlp.gate_proj.out_features == model.config.intermediate_size
    torch.testing.assert_close(outputs(reloaded, inputs), masked, rtol=0, atol=1e-5)


def test_slim_without_ratio_or_masks_says_what_to_do_and_writes_nothing(tmp_path: Path) -> None:
    folder, _ = _folder(tmp_path)
    result = CliRunner().invoke(main, ["slim", str(folder), str(tmp_path / "out")])
    assert result.exit_code == 1 and "give --ratio" in result.output
    assert not (tmp_path / "out").exists()


def test_slim_refuses_an_output_folder_that_holds_files_without_force(tmp_path: Path) -> None:
    folder, _ = _folder(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    result = CliRunner().invoke(main, ["slim", str(folder), str(tmp_path / "out"), "--ratio", "0.5"])
    assert result.exit_code == 1 and (tmp_path / "out" / "keep.txt").read_text() == "mine"
    result = CliRunner().invoke(main, ["slim", str(folder), str(tmp_path / "out"), "--ratio", "0.5", "--force"])
    assert result.exit_code == 0 and not (tmp_path / "out" / "keep.txt").exists()


def test_slim_an_unknown_importance_is_one_line(tmp_path: Path) -> None:
    folder, _ = _folder(tmp_path)
    result = CliRunner().invoke(main, ["slim", str(folder), str(tmp_path / "o"), "--ratio", "0.5", "--importance", "x"])
    assert result.exit_code == 1 and "unknown importance 'x'" in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_the_installed_command_slims_a_folder(tmp_path: Path) -> None:
    assert SCRIPT.exists(), f"the prunereg script is not installed next to {sys.executable}"
    folder, model = _folder(tmp_path, slim_models.hf_bert)
    done = subprocess.run(
        [str(SCRIPT), "slim", str(folder), str(tmp_path / "out"), "--ratio", "0.5"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert type(model).from_pretrained(tmp_path / "out").config.hidden_size == model.config.hidden_size // 2


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (["--ratio", "0.5", "--ignore", ""], "Error: --ignore '' names the root module, and ignoring the root ignores "
         "everything: name the modules to keep whole"),
        (["--importance", "taylor"], "Error: --importance taylor applies to a ratio; without --ratio the masks choose "
         "the channels: give --ratio, or leave --importance out"),
        (["--round-to", "4"], "Error: --round-to 4 applies to a ratio; without --ratio the masks choose the channels: "
         "give --ratio, or leave --round-to out"),
    ],
    ids=["ignore the root", "importance without ratio", "round-to without ratio"],
)  # fmt: skip
def test_slim_refuses_what_would_change_nothing_before_loading_and_writes_nothing(
    tmp_path: Path, extra: list[str], line: str
) -> None:
    (tmp_path / "model").mkdir()  # no model in it: the refusal must come before any loading
    result = CliRunner().invoke(main, ["slim", str(tmp_path / "model"), str(tmp_path / "out"), *extra])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip().splitlines()[-1] == line
    assert not (tmp_path / "out").exists()


def test_slim_that_removes_nothing_says_why_in_a_warning_and_a_note(tmp_path: Path) -> None:
    folder, _ = _folder(tmp_path, slim_models.hf_bert)
    args = ["slim", str(folder), str(tmp_path / "out"), "--ratio", "0.5", "--round-to", "1000000"]
    with warnings.catch_warnings(record=True) as caught:  # the command shows them once it succeeds
        warnings.simplefilter("always")
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert [str(w.message) for w in caught if "removed nothing" in str(w.message)] == [
        "slimming removed nothing: round_to=1000000 keeps every group whole: the largest has 64 units"
    ]
    assert "0 units removed" in result.stdout and "note: slimming removed nothing" in result.stdout


@pytest.mark.slow
def test_the_installed_command_refuses_ignoring_the_root_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    done = subprocess.run(
        [str(SCRIPT), "slim", str(tmp_path / "model"), str(tmp_path / "out"), "--ratio", "0.5", "--ignore", ""],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("Error: --ignore '' names the root module")
    assert not (tmp_path / "out").exists()


def _hf_regnet() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A tiny Hugging Face RegNet: grouped 3x3 convolutions of groups of 4 channels."""
    from transformers import RegNetConfig, RegNetForImageClassification

    torch.manual_seed(0)
    config = RegNetConfig(embedding_size=8, hidden_sizes=[16, 32], depths=[1, 1], groups_width=4, num_labels=3)
    return RegNetForImageClassification(config).eval(), (torch.randn(1, 3, 32, 32),)


@pytest.mark.parametrize(("grouped", "groups", "width"), [("whole", 2, 4), ("inside", 4, 2)])
def test_slim_grouped_says_how_grouped_convolutions_lose_channels(
    tmp_path: Path, grouped: str, groups: int, width: int
) -> None:
    folder, _ = _folder(tmp_path, _hf_regnet)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["slim", str(folder), str(out), "--ratio", "0.5", "--grouped", grouped])
    assert result.exit_code == 0, result.output
    from transformers import RegNetForImageClassification

    reloaded = prunereg.from_pretrained(RegNetForImageClassification, out)
    convolution = reloaded.regnet.encoder.stages[0].layers[0].layer[1].convolution
    assert (convolution.groups, convolution.weight.shape[1]) == (groups, width)  # of 4 groups of 4 channels


def test_a_file_copied_beside_the_weights_is_opened_only_as_a_regular_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slim copied the folder's other files by name after a look: one swapped for a FIFO then was not refused."""
    folder, _ = _folder(tmp_path)
    vocab = folder / "vocab.txt"
    vocab.write_text("a\nb\n")
    is_file = Path.is_file

    def is_file_then_swap(path: Path) -> bool:
        found = is_file(path)
        if found and path == vocab:
            vocab.unlink()
            os.mkfifo(vocab)  # right after slim looked
        return found

    monkeypatch.setattr(Path, "is_file", is_file_then_swap)
    with fifo_unblocker(vocab):
        result = CliRunner().invoke(main, ["slim", str(folder), str(tmp_path / "out"), "--ratio", "0.5"])
    assert result.exit_code == 1
    assert _beside_the_hint(result.stderr) == (
        f"Error: '{vocab}' is a FIFO (named pipe), not a regular file; replace it with the model's own vocab.txt\n"
    )
    assert sorted(os.listdir(tmp_path)) == ["model"]


@pytest.mark.parametrize(("key", "gives"), [("num_hidden_layers", "num_hidden_layers"), ("hidden_size", "hidden_size")])
def test_slim_by_masks_refuses_a_config_unlike_its_weights_in_one_line(tmp_path: Path, key: str, gives: str) -> None:
    """Loading by the masks skipped the check: transformers' table and ignore_mismatched_sizes, or a block made up."""
    model, _ = slim_models.hf_smollm2_llama()
    mlp = model.model.layers[0].mlp
    prunereg.get("custom_from_mask").apply(mlp.up_proj, "weight", mask=torch.ones_like(mlp.up_proj.weight))
    prunereg.save_pretrained(model, tmp_path / "pruned")
    config = json.loads((tmp_path / "pruned" / "config.json").read_text())
    config[key] += config["num_attention_heads"] if key == "hidden_size" else 1
    (tmp_path / "pruned" / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(main, ["slim", str(tmp_path / "pruned"), str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: MODEL_DIR's config.json gives {gives} {config[key]}")
    assert result.stderr.endswith("use the config.json that came with these weights\n")
    assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_slim_by_masks_takes_a_folder_slim_wrote(tmp_path: Path) -> None:
    """The check builds the model with the shapes a slimmed folder's config records, as loading it does."""
    folder, model = _folder(tmp_path)
    assert CliRunner().invoke(main, ["slim", str(folder), str(tmp_path / "slim"), "--ratio", "0.25"]).exit_code == 0
    slimmed = prunereg.from_pretrained(type(model), tmp_path / "slim")
    mlp = slimmed.model.layers[0].mlp
    rows = torch.ones(mlp.up_proj.out_features, 1)
    rows[::2] = 0
    for layer in (mlp.gate_proj, mlp.up_proj):
        prunereg.get("custom_from_mask").apply(layer, "weight", mask=rows.expand_as(layer.weight).clone())
    prunereg.save_pretrained(slimmed, tmp_path / "masked")
    result = CliRunner().invoke(main, ["slim", str(tmp_path / "masked"), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    reloaded = prunereg.from_pretrained(type(model), tmp_path / "out")
    assert reloaded.model.layers[0].mlp.up_proj.out_features == mlp.up_proj.out_features // 2
