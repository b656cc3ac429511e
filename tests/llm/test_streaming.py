"""prunereg.oneshot_folder: block-by-block pruning of a safetensors folder equals pruning the loaded model."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
import torch

import prunereg

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import AutoModelForCausalLM

from tests.support.tiny_lm import calibration_ids, tiny_gpt2, tiny_llama, tiny_opt


def _load(folder):
    return AutoModelForCausalLM.from_pretrained(folder).eval()


@pytest.mark.parametrize(
    ("build", "method", "options"),
    [(tiny_llama, "wanda", {}), (tiny_llama, "sparsegpt", {"pattern": "2:4"}), (tiny_gpt2, "sparsegpt", {}),
     (tiny_opt, "wanda", {"allocation": "owl", "sparsity": 0.6})],
)  # fmt: skip
def test_streamed_pruning_equals_pruning_the_model_in_memory(tmp_path, build, method, options):
    build().save_pretrained(tmp_path / "dense", max_shard_size="20KB")  # several shards, blocks across them
    ids = calibration_ids(4, 16)
    report = prunereg.oneshot_folder(tmp_path / "dense", tmp_path / "pruned", method, calibration=ids, **options)
    in_memory = _load(tmp_path / "dense")
    expected = prunereg.oneshot(in_memory, method, calibration=ids, **options)
    streamed = _load(tmp_path / "pruned")
    for (name, a), b in zip(streamed.state_dict().items(), in_memory.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert [(r.name, r.sparsity) for r in report.layers] == [(r.name, r.sparsity) for r in expected.layers]
    assert report.block_sparsities == expected.block_sparsities and report.timings.loading > 0


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_a_mixture_whose_folder_holds_each_expert_apart_prunes_as_in_memory_and_is_written_so(tmp_path, method):
    from tests.shrink.models import tiny_mixtral

    tiny_mixtral().save_pretrained(tmp_path / "dense")  # block_sparse_moe.experts.3.w1, as Mixtral's checkpoints
    ids = calibration_ids(4, 16)
    report = prunereg.oneshot_folder(tmp_path / "dense", tmp_path / "pruned", method, calibration=ids)
    in_memory = _load(tmp_path / "dense")
    expected = prunereg.oneshot(in_memory, method, calibration=ids)
    streamed = _load(tmp_path / "pruned")
    for (name, a), b in zip(streamed.state_dict().items(), in_memory.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert [(r.name, r.sparsity) for r in report.layers] == [(r.name, r.sparsity) for r in expected.layers]
    names = json.loads((tmp_path / "pruned" / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.1.block_sparse_moe.experts.3.w1.weight" in names


def test_the_output_folder_has_one_shard_per_block_an_index_and_the_other_files(tmp_path):
    tiny_llama(layers=3).save_pretrained(tmp_path / "dense")
    (tmp_path / "dense" / "tokenizer.json").write_text("{}")
    prunereg.oneshot_folder(tmp_path / "dense", tmp_path / "pruned", "magnitude", calibration=calibration_ids(2, 8))
    names = sorted(p.name for p in (tmp_path / "pruned").iterdir())
    shards = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    assert names == sorted(["config.json", "generation_config.json", "tokenizer.json",
                            "model.safetensors.index.json", *shards])  # fmt: skip
    index = json.loads((tmp_path / "pruned" / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["model.layers.1.mlp.up_proj.weight"] == shards[1]
    assert index["weight_map"]["lm_head.weight"] == shards[3]


def test_bad_folders_are_refused_before_anything_is_written(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        prunereg.oneshot_folder(tmp_path / "empty", tmp_path / "out", "wanda", calibration=calibration_ids(2, 8))
    tiny_llama().save_pretrained(tmp_path / "dense")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        prunereg.oneshot_folder(tmp_path / "dense", tmp_path / "busy", "wanda", calibration=calibration_ids(2, 8))
    with pytest.raises(ValueError, match="sparsity"):
        prunereg.oneshot_folder(tmp_path / "dense", tmp_path / "out", "wanda", calibration=calibration_ids(2, 8),
                                sparsity=1.5)  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_only_the_block_being_pruned_holds_weights(tmp_path, monkeypatch):
    import prunereg._runtime.streamed as streamed
    from tests.support.tiny_lm import NormScore

    tiny_llama(layers=3).save_pretrained(tmp_path / "dense")
    built = []
    build = streamed.empty_causal_lm
    monkeypatch.setattr(streamed, "empty_causal_lm", lambda *args: built.append(build(*args)) or built[0])

    class CountingBlocks(NormScore):
        loaded_blocks: ClassVar[list[int]] = []

        def prune_group(self, weights, statistics, sparsities):
            blocks = built[0].model.layers
            self.loaded_blocks.append(sum(not block.mlp.up_proj.weight.is_meta for block in blocks))
            return super().prune_group(weights, statistics, sparsities)

    method = CountingBlocks(0.5)
    prunereg.oneshot_folder(tmp_path / "dense", tmp_path / "pruned", method, calibration=calibration_ids(2, 8))
    assert method.loaded_blocks == [1] * 12  # 4 groups in each of 3 blocks
    assert all(block.mlp.up_proj.weight.is_meta for block in built[0].model.layers)


@pytest.mark.slow
def test_the_streaming_benchmark_runs_under_its_cap(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "llm_streaming.py"
    completed = subprocess.run(
        [sys.executable, str(script), "--layers", "2", "--hidden", "256", "--intermediate", "512", "--vocab", "1000",
         "--heads", "4", "--budget", "4", "--folder", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    row = next(line for line in completed.stdout.splitlines() if line.startswith("| prunereg.oneshot_folder"))
    assert "| 50.0% zeros |" in row
    assert (tmp_path / "pruned" / "model.safetensors.index.json").is_file()


def test_the_output_folder_appears_whole_or_not_at_all_and_is_replaced_only_when_asked(tmp_path):
    tiny_llama().save_pretrained(tmp_path / "dense")
    ids = calibration_ids(2, 8)

    class FailsInTheLastBlock(prunereg.get("magnitude")):
        calls = 0

        def prune_group(self, weights, statistics, sparsities):
            FailsInTheLastBlock.calls += 1
            if FailsInTheLastBlock.calls > 7:  # the first block's seven layers, each a group of its own
                raise RuntimeError("the method failed")
            return super().prune_group(weights, statistics, sparsities)

    with pytest.raises(RuntimeError, match="the method failed"):
        prunereg.oneshot_folder(tmp_path / "dense", tmp_path / "pruned", FailsInTheLastBlock(0.5), calibration=ids)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dense"]  # no half-written folder, no temporary
    prunereg.oneshot_folder(tmp_path / "dense", tmp_path / "pruned", "magnitude", calibration=ids, sparsity=0.25)
    with pytest.raises(FileExistsError, match="pass replace=True to replace it"):
        prunereg.oneshot_folder(tmp_path / "dense", tmp_path / "pruned", "magnitude", calibration=ids)
    prunereg.oneshot_folder(tmp_path / "dense", tmp_path / "pruned", "magnitude", calibration=ids, replace=True)
    weight = _load(tmp_path / "pruned").get_parameter("model.layers.1.mlp.up_proj.weight")
    assert (weight == 0).float().mean() == 0.5
    with pytest.raises(IsADirectoryError, match="is model_dir"):
        prunereg.oneshot_folder(tmp_path / "dense", tmp_path / "dense", "magnitude", calibration=ids, replace=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dense", "pruned"]
