"""Streamed commands on a folder of a model tying its head to its input embedding, whichever name the folder holds.

``safetensors.torch.save_model`` keeps one name for tensors that share memory: the
tied embedding is then stored as ``lm_head.weight`` alone. The streamed output must
be what the command writes in memory: the same tensor names and values.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import prunereg
from prunereg._cli import main

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from safetensors.torch import load_file, save_file, save_model  # noqa: E402

from tests.support.processes import run_prunereg  # noqa: E402
from tests.support.tiny_lm import calibration_ids, random_text, save_tiny_llama_folder, tiny_llama  # noqa: E402

COMMANDS = {
    "oneshot": ["--method", "wanda"],
    "shrink": ["-m", "wanda_sp", "--mlp", "0.5", "--heads", "0.5"],
}
EMBEDDING, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def _tied_folder(folder: Path, head: torch.Tensor | None = None) -> Path:
    """A tiny tied Llama with a tokenizer; its weights saved by ``save_model`` (the head's name alone) or, given
    ``head``, under both names with ``head`` as the head's."""
    save_tiny_llama_folder(folder)
    model = tiny_llama(seed=3, tie_word_embeddings=True)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    model.config.save_pretrained(folder)
    if head is None:
        save_model(model, str(folder / "model.safetensors"))
        assert HEAD in load_file(folder / "model.safetensors") and EMBEDDING not in load_file(
            folder / "model.safetensors"
        )
    else:
        tensors = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        tensors[HEAD] = head
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder.parent / "calibration.txt").write_text(random_text(200, seed=1))
    return folder


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def _assert_same_weights(folder: Path, expected: dict[str, torch.Tensor]) -> None:
    written = _weights(folder)
    assert sorted(written) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(written[name], tensor), name


def _run(command: str, source: Path, output: Path, *extra: str, through: str = "runner") -> None:
    args = [
        command, str(source), str(output), *COMMANDS[command], "--calibration", str(source.parent / "calibration.txt"),
        "--samples", "4", "--seq-len", "32", *extra,
    ]  # fmt: skip
    if through == "runner":
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    else:
        completed = run_prunereg(args)
        assert completed.returncode == 0, completed.stderr


@pytest.mark.parametrize(
    ("command", "through"),
    [("oneshot", "runner"), ("shrink", "runner"), pytest.param("shrink", "subprocess", marks=pytest.mark.slow)],
)
def test_a_streamed_command_on_a_head_named_tied_folder_writes_what_it_writes_in_memory(
    command: str, through: str, tmp_path: Path
) -> None:
    dense = _tied_folder(tmp_path / "dense")
    _run(command, dense, tmp_path / "in_memory")
    _run(command, dense, tmp_path / "streamed", "--stream", through=through)
    expected = _weights(tmp_path / "in_memory")
    assert EMBEDDING in expected and HEAD not in expected
    _assert_same_weights(tmp_path / "streamed", expected)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "streamed")
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight


def _in_memory_and_streamed(tmp_path: Path, dense: Path, how: str) -> tuple[torch.nn.Module, Path]:
    """The folder pruned (``how`` "oneshot") or shrunk in memory, and by the Python form of the streamed command."""
    ids = calibration_ids(4, 16)
    model = transformers.AutoModelForCausalLM.from_pretrained(dense).eval()
    if how == "oneshot":
        prunereg.oneshot(model, "wanda", calibration=ids)
        prunereg.oneshot_folder(dense, tmp_path / "streamed", "wanda", calibration=ids)
    else:
        prunereg.shrink(model, "flap", ids, mlp=0.5, heads=0.5)
        prunereg.shrink_folder(dense, tmp_path / "streamed", "flap", ids, mlp=0.5, heads=0.5)
    model.save_pretrained(tmp_path / "in_memory")
    return model, tmp_path / "streamed"


@pytest.mark.parametrize("how", ["oneshot", "shrink"])
def test_the_python_forms_stream_a_head_named_tied_folder_as_they_run_in_memory(how: str, tmp_path: Path) -> None:
    model, streamed = _in_memory_and_streamed(tmp_path, _tied_folder(tmp_path / "dense"), how)
    _assert_same_weights(streamed, _weights(tmp_path / "in_memory"))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(streamed).eval()
    ids = calibration_ids(2, 12, seed=7)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)


def test_a_folder_holding_both_names_with_one_value_is_written_under_the_embedding_name(tmp_path: Path) -> None:
    dense = _tied_folder(tmp_path / "dense", head=tiny_llama(seed=3, tie_word_embeddings=True).lm_head.weight.detach())
    _in_memory_and_streamed(tmp_path, dense, "oneshot")
    written = _weights(tmp_path / "streamed")
    assert EMBEDDING in written and HEAD not in written
    _assert_same_weights(tmp_path / "streamed", _weights(tmp_path / "in_memory"))


def test_a_folder_holding_both_names_with_different_values_is_loaded_untied_as_in_memory(tmp_path: Path) -> None:
    head = torch.randn(64, 32, generator=torch.Generator().manual_seed(5))
    dense = _tied_folder(tmp_path / "dense", head=head)
    with pytest.warns(UserWarning, match=r"model_dir's config ties .* lm_head\.weight with different values"):
        model, streamed = _in_memory_and_streamed(tmp_path, dense, "oneshot")
    assert model.lm_head.weight is not model.model.embed_tokens.weight  # transformers loads the pair apart
    _assert_same_weights(streamed, _weights(tmp_path / "in_memory"))
    assert torch.equal(_weights(streamed)[HEAD], head)
