"""Saved masks are tied to the weights they were saved with, and hold only 0 and 1, wherever they are loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

import prunereg
import prunereg.prune as prune
from prunereg._models.huggingface import MASKS_FILE, WEIGHT_ZEROS_KEY
from tests.support.tiny_lm import tiny_llama

transformers = pytest.importorskip("transformers")
AutoModelForCausalLM = transformers.AutoModelForCausalLM

LAYER = "model.layers.0.mlp.up_proj"


def _pruned(amount: float) -> nn.Module:
    model = tiny_llama()
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.startswith("model.layers"):
            prune.l1_unstructured(module, "weight", amount=amount)
    return model


def _zeros(model: nn.Module) -> float:
    return (model.get_submodule(LAYER).weight == 0).float().mean().item()


def test_a_masks_file_left_by_an_earlier_save_is_refused(tmp_path: Path) -> None:
    prunereg.save_pretrained(_pruned(0.3), tmp_path)
    later = _pruned(0.65)
    for module in later.modules():
        if hasattr(module, "weight_mask"):
            prune.remove(module, "weight")
    later.save_pretrained(tmp_path)  # a plain save over the folder leaves the old masks file there
    assert (tmp_path / MASKS_FILE).is_file()
    stale = rf"^{MASKS_FILE} in '{tmp_path}' was saved with other weights than the folder holds now \(model\.layers\."
    with pytest.raises(ValueError, match=stale + r"\d\.\S+ differs\): it is stale"):
        prunereg.from_pretrained(AutoModelForCausalLM, tmp_path)
    assert _zeros(AutoModelForCausalLM.from_pretrained(tmp_path)) == pytest.approx(0.65, abs=0.02)


def test_the_masks_file_records_the_zeros_of_each_saved_weight(tmp_path: Path) -> None:
    prunereg.save_pretrained(_pruned(0.5), tmp_path)
    with safe_open(str(tmp_path / MASKS_FILE), "pt") as handle:
        recorded = json.loads(handle.metadata()[WEIGHT_ZEROS_KEY])
    assert len(recorded) == 14 and all(len(digest) == 64 for digest in recorded.values())
    loaded = prunereg.from_pretrained(AutoModelForCausalLM, tmp_path)
    assert _zeros(loaded) == 0.5


def test_a_model_loaded_in_another_dtype_keeps_its_masks(tmp_path: Path) -> None:
    """The check reads the weights as saved: float16 may round a kept weight to zero without making the masks stale."""
    model = _pruned(0.5)
    with torch.no_grad():
        model.get_submodule(LAYER).weight_orig[model.get_submodule(LAYER).weight_mask.bool()] *= 1e-9
    prunereg.save_pretrained(model, tmp_path)
    loaded = prunereg.from_pretrained(AutoModelForCausalLM, tmp_path, dtype=torch.float16)
    assert loaded.get_submodule(LAYER).weight.dtype == torch.float16 and prunereg.is_pruned(loaded)


def test_a_masks_file_without_a_record_is_applied_only_where_it_fits_the_weights(tmp_path: Path) -> None:
    prunereg.save_pretrained(_pruned(0.5), tmp_path)
    masks = load_file(tmp_path / MASKS_FILE)
    save_file(masks, tmp_path / MASKS_FILE)  # as prunereg 0.1 wrote it: no metadata
    with pytest.warns(UserWarning, match="records no digest of its weights"):
        assert _zeros(prunereg.from_pretrained(AutoModelForCausalLM, tmp_path)) == 0.5
    masks[f"{LAYER}.weight"] = torch.zeros_like(masks[f"{LAYER}.weight"])  # prunes weights that are not zero
    save_file(masks, tmp_path / MASKS_FILE)
    with pytest.raises(ValueError, match="it is stale"):
        prunereg.from_pretrained(AutoModelForCausalLM, tmp_path)


def test_masks_with_values_other_than_0_and_1_are_refused_by_from_pretrained(tmp_path: Path) -> None:
    prunereg.save_pretrained(_pruned(0.5), tmp_path)
    with safe_open(str(tmp_path / MASKS_FILE), "pt") as handle:
        metadata = handle.metadata()
    masks = load_file(tmp_path / MASKS_FILE)
    masks[f"{LAYER}.weight"] = masks[f"{LAYER}.weight"].float() * 0.5
    save_file(masks, tmp_path / MASKS_FILE, metadata=metadata)
    with pytest.raises(ValueError, match=rf"^the mask for '{LAYER}.weight' holds values other than 0 and 1"):
        prunereg.from_pretrained(AutoModelForCausalLM, tmp_path)


def test_a_plain_save_with_a_scaling_mask_is_refused_by_from_pretrained(tmp_path: Path) -> None:
    model = tiny_llama()
    prune.custom_from_mask(model.get_submodule(LAYER), "weight", torch.full((48, 32), 0.5))  # torch allows it
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds values other than 0 and 1"):
        prunereg.from_pretrained(AutoModelForCausalLM, tmp_path)


def test_apply_masks_refuses_values_other_than_0_and_1_and_changes_nothing() -> None:
    model = tiny_llama()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    masks = {f"{LAYER}.weight": torch.ones(48, 32), "model.layers.1.mlp.up_proj.weight": torch.full((48, 32), 2.0)}
    with pytest.raises(ValueError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' holds values other than 0 and 1"):
        prunereg.apply_masks(model, masks)
    assert not prunereg.is_pruned(model)
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


@pytest.mark.parametrize("target_pruned", [False, True])
def test_load_state_dict_refuses_masks_with_other_values(target_pruned: bool) -> None:
    source = tiny_llama()
    prune.custom_from_mask(source.get_submodule(LAYER), "weight", torch.full((48, 32), 0.5))
    state = source.state_dict()
    target = tiny_llama(seed=3)
    if target_pruned:
        prune.identity(target.get_submodule(LAYER), "weight")
    before = {name: tensor.clone() for name, tensor in target.state_dict().items()}
    with pytest.raises(ValueError, match=rf"the mask for '{LAYER}.weight' holds values other than 0 and 1"):
        prunereg.load_state_dict(target, state)
    assert all(torch.equal(before[name], tensor) for name, tensor in target.state_dict().items())
