"""prunereg.shrink_folder: a model folder shrunk block by block equals the one shrunk in memory, and reloads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

import prunereg  # noqa: E402
from tests.shrink.models import build, calibration_ids  # noqa: E402

CASES = [
    ("llama", "flap", {"mlp": 0.5, "heads": 0.5}),
    ("llama", "block_influence", {"layers": 2}),
    ("gpt2", "wanda_sp", {"mlp": 0.5}),
    ("qwen2", "magnitude_sp", {"mlp": 0.25, "heads": 0.5}),
    ("mixtral", "reap", {"experts": 0.5}),  # its folder holds every expert apart, transformers stacks them
    ("qwen2_moe", "reap", {"experts": 0.5}),
    ("qwen2_moe", "magnitude_sp", {"heads": 0.5}),
]


@pytest.mark.parametrize(("architecture", "method", "options"), CASES, ids=lambda v: str(v))
def test_a_folder_shrunk_block_by_block_equals_the_model_shrunk_in_memory(
    architecture: str, method: str, options: dict[str, Any], tmp_path: Path
) -> None:
    build(architecture).save_pretrained(tmp_path / "dense")
    in_memory = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense").eval()
    expected = prunereg.shrink(in_memory, method, calibration_ids(), **options)
    report = prunereg.shrink_folder(tmp_path / "dense", tmp_path / "small", method, calibration_ids(), **options)
    assert report.removed_blocks == expected.removed_blocks
    assert (report.params_before, report.params_after) == (expected.params_before, expected.params_after)
    assert [block.kept for block in report.blocks] == [block.kept for block in expected.blocks]
    small = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "small").eval()
    ids = calibration_ids(2, 12, seed=7)
    with torch.no_grad():
        assert torch.equal(small(ids).logits, in_memory(ids).logits)


def test_removed_blocks_leave_no_shard_and_the_index_names_the_new_indices(tmp_path: Path) -> None:
    build("llama").save_pretrained(tmp_path / "dense")
    report = prunereg.shrink_folder(
        tmp_path / "dense", tmp_path / "small", "block_influence", calibration_ids(), layers=2
    )
    assert len(report.removed_blocks) == 2
    index = (tmp_path / "small" / "model.safetensors.index.json").read_text()
    assert "model.layers.0." in index and "model.layers.1." not in index and "model.layers.2." not in index
    assert len(list((tmp_path / "small").glob("*.safetensors"))) == 2  # the kept block and the rest


def test_a_mixture_whose_folder_holds_each_expert_apart_is_written_so_with_the_removed_experts_gone(
    tmp_path: Path,
) -> None:
    import json

    build("mixtral").save_pretrained(tmp_path / "dense")  # as Mixtral's checkpoints: block_sparse_moe.experts.3.w1
    before = json.loads((tmp_path / "dense" / "config.json").read_text())["num_local_experts"]
    prunereg.shrink_folder(tmp_path / "dense", tmp_path / "small", "reap", calibration_ids(), experts=0.5)
    names = set(json.loads((tmp_path / "small" / "model.safetensors.index.json").read_text())["weight_map"])
    experts = {int(name.split(".experts.")[1].split(".")[0]) for name in names if ".experts." in name}
    assert experts == set(range(before // 2)) and not any("gate_up_proj" in name for name in names)
    assert "model.layers.0.block_sparse_moe.experts.0.w2.weight" in names


def test_a_refused_request_writes_no_folder(tmp_path: Path) -> None:
    build("llama").save_pretrained(tmp_path / "dense")
    with pytest.raises(ValueError, match="would leave no channel"):
        prunereg.shrink_folder(tmp_path / "dense", tmp_path / "small", "flap", calibration_ids(), mlp=0.99)
    assert not (tmp_path / "small").exists()
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".prunereg-")]


def test_an_output_folder_holding_files_is_replaced_only_when_asked(tmp_path: Path) -> None:
    build("llama").save_pretrained(tmp_path / "dense")
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "keep.txt").write_text("mine")
    with pytest.raises(OSError, match="replace=True"):
        prunereg.shrink_folder(tmp_path / "dense", tmp_path / "small", "magnitude_sp", mlp=0.5)
    assert (tmp_path / "small" / "keep.txt").exists()
    prunereg.shrink_folder(tmp_path / "dense", tmp_path / "small", "magnitude_sp", mlp=0.5, replace=True)
    assert not (tmp_path / "small" / "keep.txt").exists()
    assert transformers.AutoConfig.from_pretrained(tmp_path / "small").intermediate_size == 24
