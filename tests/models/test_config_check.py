"""A folder's config.json is checked against its weights' safetensors headers before any model is built."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file

from prunereg._disk.model_dir import WeightHeaders
from prunereg._disk.safetensors_file import TensorEntry
from prunereg._models import hf_folder
from prunereg._models.config_check import check_config
from tests.support.model_folders import (
    BEYOND_THE_WEIGHTS,
    FIX,
    UNLIKE_THE_WEIGHTS,
    edit_config,
    saved_tiny_llama,
)
from tests.support.tiny_lm import tiny_gpt2, tiny_llama

LOADERS: dict[str, Callable[[Path], Any]] = {
    "load_config": hf_folder.load_config,
    "load_causal_lm": hf_folder.load_causal_lm,
    "load_model": hf_folder.load_model,
    "empty_causal_lm": hf_folder.empty_causal_lm,
}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_tiny_llama(tmp_path_factory)


@pytest.fixture
def model(template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(template, tmp_path / "model"))


@pytest.fixture
def nothing_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if transformers reads the config or builds or loads a model."""
    import transformers

    def never(*_: object, **__: object) -> None:
        pytest.fail("transformers was handed the folder before the config was checked")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", never)


@pytest.mark.usefixtures("nothing_built")
@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize(("changes", "refusal"), BEYOND_THE_WEIGHTS)
def test_a_count_or_width_the_weights_cannot_hold_is_refused_before_transformers_reads_the_config(
    model: Path, loader: str, changes: dict[str, int], refusal: str
) -> None:
    edit_config(model, **changes)
    with pytest.raises(ValueError) as refused:
        LOADERS[loader](model)
    assert str(refused.value) == f"MODEL_DIR's config.json {refusal}{FIX}"


@pytest.mark.parametrize("loader", [name for name in LOADERS if name != "load_config"])
@pytest.mark.parametrize(("changes", "refusal"), UNLIKE_THE_WEIGHTS)
def test_a_model_unlike_its_weights_is_refused_before_any_weight_is_allocated(
    model: Path, loader: str, changes: dict[str, int], refusal: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    def never(*_: object, **__: object) -> None:
        pytest.fail("the weights were loaded before the model was checked against them")

    monkeypatch.setattr(transformers.LlamaForCausalLM, "from_pretrained", never)
    edit_config(model, **changes)
    with pytest.raises(ValueError) as refused:
        LOADERS[loader](model)
    assert str(refused.value) == f"MODEL_DIR's config.json {refusal}{FIX}"


def test_keys_of_a_sub_config_are_checked_too() -> None:
    weights = WeightHeaders({"embed.weight": TensorEntry("F32", (64, 32))}, (Path("model.safetensors"),))
    check_config({"text_config": {"hidden_size": 32}}, weights, "model_dir")
    with pytest.raises(ValueError, match=r"^model_dir's config.json gives text_config.hidden_size 4096, but no tensor"):
        check_config({"text_config": {"hidden_size": 4096}}, weights, "model_dir")


def test_folders_whose_checkpoint_names_differ_from_the_model_still_load(tmp_path: Path) -> None:
    tied = tmp_path / "tied"
    tiny_llama(tie_word_embeddings=True).save_pretrained(tied)  # the head is stored once, as the embedding
    unprefixed = tmp_path / "gpt2"
    gpt2 = tiny_gpt2()
    gpt2.save_pretrained(unprefixed)  # then its tensors saved without the base model's prefix, as GPT-2 was
    tensors = load_file(unprefixed / "model.safetensors")
    stripped = {
        name.removeprefix("transformer."): tensor for name, tensor in tensors.items() if name != "lm_head.weight"
    }
    save_file(stripped, unprefixed / "model.safetensors", metadata={"format": "pt"})
    for folder in (tied, unprefixed):
        for loader in ("load_causal_lm", "load_model", "empty_causal_lm"):
            LOADERS[loader](folder)
    loaded = hf_folder.load_causal_lm(unprefixed)
    assert torch.equal(loaded.get_parameter("transformer.h.1.mlp.c_fc.weight"), gpt2.transformer.h[1].mlp.c_fc.weight)
    edit_config(unprefixed, n_embd=40)
    with pytest.raises(ValueError, match=r"gives n_embd 40, but model.safetensors holds transformer.wte.weight as"):
        hf_folder.empty_causal_lm(unprefixed)
