"""``prunereg slim --stream`` and ``prunereg.slim_folder``: a folder slimmed tensor by tensor on a meta model.

The output must be the in-memory command's, file for file and byte for byte; what needs the model's values in
memory is refused before anything is read; a bad folder or a signal leaves no output; and no more than two of
the folder's tensors are ever alive at once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import prunereg
from prunereg._cli import main
from prunereg._disk.folder import AtomicFolder
from prunereg._models.hf_folder import load_model
from prunereg._runtime.streamed import CheckpointReader
from prunereg._slim import folder as streamed
from prunereg._slim.engine import SlimArguments
from tests.support import slim_models
from tests.support.processes import DEFAULT_TERMINATION
from tests.support.tiny_lm import random_text, save_tiny_llama_folder

pytest.importorskip("transformers")

SCRIPT = Path(sys.executable).with_name("prunereg")


def _save(tmp_path: Path, kind: str) -> Path:
    folder = tmp_path / "model"
    if kind == "llama":  # with a tokenizer, which both copy
        save_tiny_llama_folder(folder)
    else:
        getattr(slim_models, kind)()[0].save_pretrained(folder)
    return folder


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def _slim(folder: Path, out: Path, *extra: str, seed: int = 5) -> str:
    torch.manual_seed(seed)  # random's draws; magnitude takes none
    result = CliRunner().invoke(main, ["slim", str(folder), str(out), "--ratio", "0.5", "--json", *extra])
    assert result.exit_code == 0, result.output
    return result.stdout


CASES = {
    "llama-magnitude": ("llama", ["--importance", "magnitude"]),
    "llama-random": ("llama", ["--importance", "random"]),
    "llama-per-layer-widths-recorded": ("llama", ["--ignore", "model.layers.0.mlp"]),
    "tied-llama": ("hf_smollm2_llama", []),
    "bert": ("hf_bert", []),
    "gpt2-conv1d": ("hf_gpt2", []),
    "resnet-batch-norm-buffers": ("hf_resnet50", []),
    "gemma-config-kept-and-recorded": ("hf_gemma", []),
    "mixtral-experts-one-module-each": ("hf_mixtral", []),
    "qwen3-moe-experts-one-module-each": ("hf_qwen3_moe", []),
}


@pytest.mark.parametrize(("kind", "extra"), CASES.values(), ids=CASES.keys())
def test_a_streamed_slim_writes_the_in_memory_slims_folder_byte_for_byte(
    tmp_path: Path, kind: str, extra: list[str]
) -> None:
    folder = _save(tmp_path, kind)
    in_memory = _slim(folder, tmp_path / "memory", *extra)
    streamed_report = _slim(folder, tmp_path / "stream", *extra, "--stream")
    assert streamed_report == in_memory
    expected, got = _files(tmp_path / "memory"), _files(tmp_path / "stream")
    assert list(got) == list(expected) and "model.safetensors" in got and "config.json" in got
    assert got == expected
    recorded = "prunereg_slimmed" in json.loads(got["config.json"])
    # per-layer widths, or Gemma's embed_scale from hidden_size: the record; else the config states the widths
    assert recorded == (kind == "hf_gemma" or "--ignore" in extra)
    if kind in ("hf_mixtral", "hf_qwen3_moe"):  # written as the checkpoint holds them: one module per expert
        weights = got["model.safetensors"]
        names = set(json.loads(weights[8 : 8 + int.from_bytes(weights[:8], "little")]))
        assert any(".experts.3." in name for name in names) and not any("gate_up_proj" in name for name in names)


def test_eval_with_stream_measures_the_model_before_and_the_written_one_after_as_in_memory(tmp_path: Path) -> None:
    folder = _save(tmp_path, "llama")
    (tmp_path / "text.txt").write_text(random_text(400))
    flags = ["--eval", str(tmp_path / "text.txt"), "--eval-window", "64"]
    in_memory = json.loads(_slim(folder, tmp_path / "memory", *flags))
    assert json.loads(_slim(folder, tmp_path / "stream", *flags, "--stream")) == in_memory
    assert in_memory["perplexity_before"] != in_memory["perplexity_after"]


def test_a_large_slimmed_model_is_sharded_as_save_pretrained_shards_it(tmp_path: Path) -> None:
    folder = _save(tmp_path, "llama")
    model = load_model(folder)
    report = prunereg.slim(model, streamed.example_inputs(model), ratio=0.5)
    model.save_pretrained(tmp_path / "memory", max_shard_size=20_000)
    streamed.copy_beside_the_weights(folder, tmp_path / "memory")
    out = AtomicFolder(tmp_path / "stream")
    with out as staging:
        got = streamed.slim_folder_into(folder, out, staging, "model_dir", SlimArguments(0.5), max_shard_size=20_000)
    assert got.as_dict() == report.as_dict()
    files = _files(tmp_path / "stream")
    assert "model.safetensors.index.json" in files and "model-00002-of-00002.safetensors" in files
    assert files == _files(tmp_path / "memory")


def test_slim_folder_is_the_commands_work_in_python(tmp_path: Path) -> None:
    folder = _save(tmp_path, "hf_bert")
    in_memory = _slim(folder, tmp_path / "memory")
    report = prunereg.slim_folder(folder, tmp_path / "stream", ratio=0.5)
    assert '"removed": ' + str(report.removed) in in_memory
    assert _files(tmp_path / "stream") == _files(tmp_path / "memory")
    with pytest.raises(FileExistsError):
        prunereg.slim_folder(folder, tmp_path / "stream", ratio=0.5)
    prunereg.slim_folder(folder, tmp_path / "stream", ratio=0.25, replace=True)


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (
            ["--ratio", "0.5", "--importance", "taylor"],
            "Error: --importance taylor ranks by the model's values in "
            "memory (taylor by its gradients); a folder slimmed streamed ranks by magnitude or random",
        ),
        (
            [],
            "Error: slimming by the folder's masks reads them with the whole model in memory: give --ratio, or slim "
            "it without streaming",
        ),
        (
            ["--ratio", "0.5", "--dtype", "float16"],
            "Error: --stream keeps the checkpoint's dtype; leave --dtype out or drop --stream",
        ),
    ],
    ids=["taylor", "masks", "dtype"],
)
def test_what_needs_the_model_in_memory_is_refused_in_one_line_before_the_folder_is_read(
    tmp_path: Path, extra: list[str], line: str
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()  # no config, no weights: refused before either is looked for
    result = CliRunner().invoke(main, ["slim", str(folder), str(tmp_path / "out"), "--stream", *extra])
    assert result.exit_code == 2 and result.stderr.splitlines()[-1] == line
    assert not (tmp_path / "out").exists()


def test_slim_folder_refuses_an_importance_that_needs_values_by_name_or_instance(tmp_path: Path) -> None:
    class Own(prunereg.Importance):
        def __call__(self, group, values):  # type: ignore[no-untyped-def]
            return torch.zeros(group.size, dtype=torch.float64)

    for importance in ("taylor", Own()):
        with pytest.raises(ValueError, match=r"ranks by the model's values in memory"):
            prunereg.slim_folder(tmp_path / "nowhere", tmp_path / "out", ratio=0.5, importance=importance)
    assert not (tmp_path / "out").exists()


def test_a_folder_missing_a_weight_is_refused_in_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = _save(tmp_path, "llama")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    result = CliRunner().invoke(main, ["slim", str(folder), str(tmp_path / "out"), "--ratio", "0.5", "--stream"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1].startswith("Error: MODEL_DIR") and "model.layers.1.mlp.up_proj" in (
        result.stderr
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]


def test_a_failure_while_writing_leaves_no_output_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _save(tmp_path, "hf_bert")
    real = streamed.SafetensorsWriter.write
    written: list[str] = []

    def write(self: streamed.SafetensorsWriter, name: str, tensor: torch.Tensor) -> None:
        if written:
            raise OSError("No space left on device")
        written.append(name)
        real(self, name, tensor)

    monkeypatch.setattr(streamed.SafetensorsWriter, "write", write)
    result = CliRunner().invoke(main, ["slim", str(folder), str(tmp_path / "out"), "--ratio", "0.5", "--stream"])
    assert result.exit_code == 1 and "No space left on device" in result.stderr
    assert written and sorted(path.name for path in tmp_path.iterdir()) == ["model"]


def test_no_more_than_two_of_the_folders_tensors_are_alive_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Count the bytes read and still alive: never the model, at most the tensor in hand and the one before."""
    from safetensors.torch import load_file

    folder = _save(tmp_path, "llama")
    real = CheckpointReader.read
    alive = {"bytes": 0, "peak": 0, "largest": 0, "total": 0}

    def read(self: CheckpointReader, keys: object) -> dict[str, torch.Tensor]:
        tensors = real(self, keys)  # type: ignore[arg-type]
        assert len(tensors) == 1, f"{len(tensors)} tensors read at once"
        for tensor in tensors.values():
            size = tensor.numel() * tensor.element_size()
            alive["bytes"] += size
            alive["peak"] = max(alive["peak"], alive["bytes"])
            alive["largest"] = max(alive["largest"], size)
            alive["total"] += size
            weakref.finalize(tensor, lambda size=size: alive.__setitem__("bytes", alive["bytes"] - size))
        return tensors

    monkeypatch.setattr(CheckpointReader, "read", read)
    prunereg.slim_folder(folder, tmp_path / "out", ratio=0.5)
    weights = sum(t.numel() * t.element_size() for t in load_file(folder / "model.safetensors").values())
    assert alive["total"] == 2 * weights  # every tensor read twice: measured, then written
    assert alive["peak"] <= 2 * alive["largest"] < weights / 4


@pytest.mark.slow  # a real process: torch and transformers imported again (about 7 s)
def test_a_signal_while_writing_leaves_nothing(tmp_path: Path) -> None:
    folder = _save(tmp_path, "hf_bert")
    program = DEFAULT_TERMINATION + (
        "import os, signal, sys\n"
        "from prunereg._disk import safetensors_file\n"
        "real = safetensors_file.SafetensorsWriter.write\n"
        "def write(self, name, tensor):\n"
        "    real(self, name, tensor)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "safetensors_file.SafetensorsWriter.write = write\n"
        "from prunereg._cli import main\n"
        "main(sys.argv[1:])\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", program, "slim", str(folder), str(tmp_path / "out"), "--ratio", "0.5", "--stream"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == -signal.SIGTERM, run.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]


@pytest.mark.slow  # a real process: torch and transformers imported again (about 9 s)
def test_the_installed_command_slims_a_folder_streamed(tmp_path: Path) -> None:
    folder = _save(tmp_path, "hf_bert")
    done = subprocess.run(
        [str(SCRIPT), "slim", str(folder), str(tmp_path / "out"), "--ratio", "0.5", "--stream"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    model = slim_models.hf_bert()[0]
    reloaded = type(model).from_pretrained(tmp_path / "out")
    assert reloaded.config.hidden_size == model.config.hidden_size // 2


def test_a_transformers_without_the_layout_helpers_is_refused_in_one_line_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers.modeling_utils

    monkeypatch.delattr(transformers.modeling_utils, "revert_weight_conversion")
    with pytest.raises(ImportError, match=r"^slimming a folder streamed writes the shards as") as error:
        prunereg.slim_folder(tmp_path / "missing", tmp_path / "out", ratio=0.5)
    assert "\n" not in str(error.value) and not (tmp_path / "out").exists()
