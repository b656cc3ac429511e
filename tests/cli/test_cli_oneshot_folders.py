"""``prunereg oneshot``: MODEL_DIR is untrusted input, OUTPUT_DIR appears whole or not at all."""

from __future__ import annotations

import json
import os
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

import prunereg
from prunereg._cli import main

pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from tests.support.tiny_lm import random_text, save_tiny_llama_folder, tiny_llama


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    save_tiny_llama_folder(tmp_path / "dense")
    (tmp_path / "calibration.txt").write_text(random_text(200, seed=1))
    (tmp_path / "eval.txt").write_text(random_text(100, seed=2))
    return tmp_path


def _invoke(folder: Path, *extra: str, model: str = "dense", input: str | None = None) -> Result:
    args = [
        "oneshot", str(folder / model), str(folder / "pruned"), "--method", "wanda",
        "--calibration", str(folder / "calibration.txt"), "--samples", "4", "--seq-len", "32", *extra,
    ]  # fmt: skip
    return CliRunner().invoke(main, args, input=input)


def _error(result: Result) -> str:
    """The error line (transformers may draw progress bars on stderr before it)."""
    assert result.exit_code == 1, result.output
    return result.stderr.splitlines()[-1]


def _entries(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def _left_alone(folder: Path, model: str = "dense") -> None:
    """Nothing at OUTPUT_DIR, no temporary folder beside it."""
    assert _entries(folder) == sorted([model, "calibration.txt", "eval.txt"])


def _edit_config(model: Path, **changes: object) -> None:
    config = json.loads((model / "config.json").read_text())
    config.update(changes)
    (model / "config.json").write_text(json.dumps(config))


# -- issue 20 item 1: no code from the folder ever runs ---------------------------------------


def _with_code(folder: Path, where: str) -> Path:
    """A copy of the tiny model whose config (or tokenizer config) names a class in the folder's own code."""
    model = folder / "evil"
    shutil.copytree(folder / "dense", model)
    ran = folder / "RAN"
    (model / "evil_code.py").write_text(
        f"open({str(ran)!r}, 'w').write('the folder's code ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast\n"
        "class EvilConfig(LlamaConfig):\n    model_type = 'evil'\n"
        "class EvilModel(LlamaForCausalLM):\n    config_class = EvilConfig\n"
        "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )
    if where == "config":
        _edit_config(
            model,
            model_type="evil",
            auto_map={"AutoConfig": "evil_code.EvilConfig", "AutoModelForCausalLM": "evil_code.EvilModel"},
        )
    else:
        tokenizer_config = json.loads((model / "tokenizer_config.json").read_text())
        tokenizer_config.update(
            tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": [None, "evil_code.EvilTokenizer"]}
        )
        (model / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return model


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("where", ["config", "tokenizer"])
def test_the_folders_code_never_runs_and_nothing_is_asked(folder: Path, where: str, stream: bool) -> None:
    model = _with_code(folder, where)
    result = _invoke(folder, *["--stream"] * stream, model="evil", input="y\ny\ny\n")
    assert result.stdout == ""  # no "Do you wish to run the custom code? [y/N]"
    assert _error(result) == (
        f"Error: MODEL_DIR '{model}' needs its own code to load (auto_map in its config or tokenizer config); "
        "prunereg never runs code from a model folder"
    )
    assert not (folder / "RAN").exists()
    assert not (folder / "pruned").exists()


def test_python_loading_runs_no_folder_code_either(folder: Path) -> None:
    model = _with_code(folder, "config")
    calibration = torch.randint(0, 60, (2, 8))
    with pytest.raises(ValueError, match="needs its own code to load"):
        prunereg.oneshot_folder(model, folder / "pruned", "wanda", calibration=calibration)
    with pytest.raises(ValueError, match="trust_remote_code"):
        prunereg.from_pretrained(AutoModelForCausalLM, model)
    assert not (folder / "RAN").exists()


# -- issue 20 item 2: no link out of MODEL_DIR is followed ------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_link_out_of_the_model_folder_is_refused_and_named(folder: Path, stream: bool) -> None:
    secret = folder / "id_rsa"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----")
    (folder / "dense" / "README.md").symlink_to(secret)
    result = _invoke(folder, *["--stream"] * stream)
    assert _error(result) == (
        f"Error: MODEL_DIR '{folder / 'dense'}' holds links that lead out of it (README.md -> '{secret}'); "
        "prunereg reads nothing outside the model folder: copy the files in or remove the links"
    )
    assert not (folder / "pruned").exists()


def test_links_inside_the_folder_and_into_the_hugging_face_cache_are_followed(folder: Path) -> None:
    """A cache snapshot (models--org--name/snapshots/REV) links every file into the repository's blobs/."""
    repository = folder / "hub" / "models--org--tiny"
    snapshot, blobs = repository / "snapshots" / "0123abc", repository / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for file in (folder / "dense").iterdir():
        shutil.copy(file, blobs / f"blob-{file.name}")
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", f"blob-{file.name}"))
    (snapshot / "NOTES.md").symlink_to("config.json")
    args = [str(snapshot), str(folder / "pruned"), "--method", "magnitude",
            "--calibration", str(folder / "calibration.txt"), "--samples", "4", "--seq-len", "32"]  # fmt: skip
    for stream in (False, True):
        result = CliRunner().invoke(main, ["oneshot", *args, *["--stream"] * stream, "--force"])
        assert result.exit_code == 0, result.output
        assert (folder / "pruned" / "config.json").is_file()


def test_an_index_naming_a_file_outside_the_folder_is_refused(folder: Path) -> None:
    outside = folder / "elsewhere.safetensors"
    shutil.move(folder / "dense" / "model.safetensors", outside)
    keys = list(load_file(outside))
    index = {"metadata": {}, "weight_map": {key: "../elsewhere.safetensors" for key in keys}}
    (folder / "dense" / "model.safetensors.index.json").write_text(json.dumps(index))
    for stream in ([], ["--stream"]):
        result = _invoke(folder, *stream)
        assert _error(result) == (
            f"Error: MODEL_DIR '{folder / 'dense'}' names '../elsewhere.safetensors', which leads out of it; "
            "prunereg reads nothing outside the model folder"
        )
        assert not (folder / "pruned").exists()


# -- issue 20 item 4: OUTPUT_DIR appears whole or not at all ----------------------------------


def _fail_in_the_second_block(monkeypatch: pytest.MonkeyPatch) -> None:
    wanda = prunereg.get("wanda")
    real = wanda.prune_group
    calls = []

    def prune_then_fail(self, weights, statistics, sparsities):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) > 4:  # the first block has four input groups
            raise RuntimeError("the method failed in block 1")
        return real(self, weights, statistics, sparsities)

    monkeypatch.setattr(wanda, "prune_group", prune_then_fail)


@pytest.mark.parametrize("stream", [False, True])
def test_a_failure_midway_leaves_no_folder_and_no_temporary(
    folder: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    _fail_in_the_second_block(monkeypatch)
    result = _invoke(folder, *["--stream"] * stream)
    assert result.exit_code == 1 and "RuntimeError: the method failed in block 1" in result.stderr  # one line
    _left_alone(folder)
    rerun_after_the_fix = _invoke(folder, *["--stream"] * stream)
    assert rerun_after_the_fix.exit_code == 1  # still failing, and nothing blocks the run
    monkeypatch.undo()
    assert _invoke(folder, *["--stream"] * stream).exit_code == 0


def test_an_existing_folder_is_refused_before_any_work_and_replaced_with_force(folder: Path) -> None:
    output = folder / "pruned"
    output.mkdir()
    (output / "stale.txt").write_text("from an earlier run")
    refused = _invoke(folder)
    assert _error(refused) == f"Error: OUTPUT_DIR '{output}' exists and is not empty; pass --force to replace it"
    replaced = _invoke(folder, "--force")
    assert replaced.exit_code == 0, replaced.output
    assert "stale.txt" not in os.listdir(output) and (output / "model.safetensors").is_file()
    assert _entries(folder) == ["calibration.txt", "dense", "eval.txt", "pruned"]


@pytest.mark.parametrize("target", ["dense", "."])
def test_model_dir_is_never_replaced_even_with_force(
    folder: Path, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(folder)
    before = {p.name: p.read_bytes() for p in (folder / "dense").iterdir()}
    args = ["oneshot", "dense", target, "-m", "magnitude", "--calibration", "calibration.txt", "--seq-len", "8",
            "--samples", "2", "--force"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    where = "is" if target == "dense" else "holds"
    assert _error(result).startswith(
        f"Error: OUTPUT_DIR '{folder / 'dense' if target == 'dense' else folder}' {where} MODEL_DIR"
    )
    assert {p.name: p.read_bytes() for p in (folder / "dense").iterdir()} == before


@pytest.mark.parametrize("stream", [False, True])
def test_a_disk_too_small_is_found_before_the_pruning_starts(
    folder: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    pruned_groups = []
    wanda = prunereg.get("wanda")
    real = wanda.prune_group
    monkeypatch.setattr(wanda, "prune_group", lambda *args: pruned_groups.append(1) or real(*args))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 20_000, 20_000))
    result = _invoke(folder, *["--stream"] * stream)
    assert _error(result).startswith(
        f"Error: cannot write OUTPUT_DIR '{folder / 'pruned'}': the disk is full (0.0 MB free, the result needs about"
    )
    assert pruned_groups == []
    _left_alone(folder)


# -- issue 20 item 5: no weight made up, no option overridden silently ------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("change", ["missing", "unexpected"])
def test_weights_missing_from_or_unexpected_in_the_folder_are_refused(folder: Path, stream: bool, change: str) -> None:
    weights_file = folder / "dense" / "model.safetensors"
    weights = load_file(weights_file)
    if change == "missing":
        del weights["model.layers.0.mlp.up_proj.weight"]
        expected = "lacks: model.layers.0.mlp.up_proj.weight"
    else:
        weights["model.layers.0.mlp.extra_proj.weight"] = torch.ones(2, 2)
        expected = "has weights the model does not know: model.layers.0.mlp.extra_proj.weight"
    save_file(weights, weights_file, metadata={"format": "pt"})
    result = _invoke(folder, *["--stream"] * stream)
    assert _error(result) == f"Error: MODEL_DIR '{folder / 'dense'}' {expected}"
    _left_alone(folder)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["-o", "permanent=False"], "-o permanent: the command writes plain pruned weights; add --masks"),
        (["--sparsity", "0.5", "-o", "sparsity=0.9"], "-o sparsity: sparsity is oneshot's own setting, not the "
         "method's; give it as --sparsity"),
        (["-o", "allocation=owl"], "give it as --allocation"),
        (["-o", "progress=True"], "the command sets it"),
    ],
)  # fmt: skip
def test_oneshots_own_arguments_through_o_are_refused(folder: Path, option: list[str], message: str) -> None:
    result = _invoke(folder, *option)
    assert result.exit_code == 2 and message in result.stderr
    _left_alone(folder)


# -- issue 20 item 6: one rule for which weight files are read ---------------------------------


def test_a_folder_with_both_a_single_file_and_an_index_is_read_as_transformers_reads_it(folder: Path) -> None:
    dense = folder / "dense"
    tiny_llama(seed=7).save_pretrained(folder / "other", max_shard_size="20KB")
    for file in (folder / "other").glob("model*.safetensors*"):
        shutil.copy(file, dense / file.name)
    assert (dense / "model.safetensors").is_file() and (dense / "model.safetensors.index.json").is_file()
    results = {}
    for stream in (False, True):
        result = _invoke(folder, "--force", *["--stream"] * stream)
        assert result.exit_code == 0, result.output
        results[stream] = AutoModelForCausalLM.from_pretrained(folder / "pruned").state_dict()
    assert all(torch.equal(results[False][name], results[True][name]) for name in results[False])
    read_by_transformers = AutoModelForCausalLM.from_pretrained(dense).state_dict()
    norm = "model.norm.weight"  # never pruned: the weights came from model.safetensors, not the shards
    assert torch.equal(results[True][norm], read_by_transformers[norm])
    assert torch.equal(read_by_transformers[norm], load_file(dense / "model.safetensors")[norm])


# -- issue 22 item 5: a GGUF marker over float weights; results shown before a failure -----------


@pytest.mark.parametrize("stream", [False, True])
def test_a_gguf_marker_over_float_weights_prunes_and_saves(folder: Path, stream: bool) -> None:
    marker = {"dequantize": False, "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "quant_method": "gguf"}
    _edit_config(folder / "dense", quantization_config=marker)
    result = _invoke(folder, *["--stream"] * stream)
    assert result.exit_code == 0, result.output
    assert "quantization_config" not in json.loads((folder / "pruned" / "config.json").read_text())
    pruned = AutoModelForCausalLM.from_pretrained(folder / "pruned")
    assert (pruned.get_parameter("model.layers.1.mlp.down_proj.weight") == 0).float().mean() == 0.5
    pruned.save_pretrained(folder / "saved_again")  # the result is a plain model again


def test_perplexity_already_computed_is_shown_before_a_failure(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import PreTrainedModel

    def disk_gone(*args: object, **kwargs: object) -> None:
        raise OSError("the disk went away")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", disk_gone)
    result = _invoke(folder, "--eval", str(folder / "eval.txt"))
    assert _error(result) == "Error: the disk went away"
    assert "wanda: 14 layers in 2 blocks pruned to 50% (uniform)" in result.stdout
    assert "perplexity on eval.txt: " in result.stdout and " after" in result.stdout
    assert "wrote" not in result.stdout
    _left_alone(folder)


# -- issue 22 item 1: --masks keeps the pruned entries at zero through fine-tuning --------------


def test_masks_keep_the_pruning_through_fine_tuning_with_adamw(folder: Path) -> None:
    result = _invoke(folder, "--masks")
    assert result.exit_code == 0, result.output
    output = folder / "pruned"
    assert (output / "prunereg_masks.safetensors").is_file()
    plain = AutoModelForCausalLM.from_pretrained(output)  # loads as it is, pruned values
    model = prunereg.from_pretrained(AutoModelForCausalLM, output)
    name = "model.layers.0.mlp.up_proj.weight"
    zeros = plain.get_parameter(name) == 0
    assert zeros.float().mean() == 0.5
    assert torch.equal(model.get_submodule("model.layers.0.mlp.up_proj").weight == 0, zeros)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ids = torch.randint(0, 60, (4, 16))
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    layer = model.get_submodule("model.layers.0.mlp.up_proj")
    assert bool((layer.weight[zeros] == 0).all()) and not torch.equal(layer.weight, plain.get_parameter(name))


def test_masks_with_stream_is_refused_in_one_line(folder: Path) -> None:
    result = _invoke(folder, "--masks", "--stream")
    assert result.exit_code == 2 and "--masks needs the whole model in memory" in result.stderr
