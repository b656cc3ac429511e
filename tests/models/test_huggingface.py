"""Hugging Face models built from tiny configs (no downloads): prune, save, reload, fine-tune, remove."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg
import prunereg.prune as prune

transformers = pytest.importorskip("transformers")
from transformers.pytorch_utils import Conv1D  # noqa: E402


@pytest.fixture(autouse=True)
def quiet_transformers() -> Iterator[None]:
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    yield
    transformers.logging.set_verbosity_warning()
    if bars:  # a later module on this worker (tests/cli/test_progress.py) expects transformers' default
        transformers.utils.logging.enable_progress_bar()


def bert() -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    return transformers.BertForMaskedLM(config)


def gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=40, n_embd=16, n_layer=1, n_head=2, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)


def llama() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=16,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.LlamaForCausalLM(config)


MODELS: dict[str, Callable[[], nn.Module]] = {"bert": bert, "gpt2": gpt2, "llama": llama}
IDS = torch.tensor([[1, 5, 9, 3, 7, 2]])


def build(kind: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[kind]().eval()


def prune_weights(model: nn.Module, amount: float = 0.5) -> list[str]:
    """Prune every Linear and Conv1D weight, named from the model so tied ones are pruned everywhere."""
    names = [f"{name}.weight" for name, module in model.named_modules() if isinstance(module, (nn.Linear, Conv1D))]
    for name in names:
        prune.l1_unstructured(model, name, amount=amount)
    return names


def logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def fine_tune(model: nn.Module, steps: int = 2) -> None:
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        model(input_ids=IDS, labels=IDS).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def masks(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: buffer for name, buffer in model.named_buffers() if name.endswith("_mask")}


@pytest.mark.parametrize("kind", MODELS)
def test_save_and_reload_while_pruned_keeps_values_and_masks(kind, tmp_path):
    model = build(kind)
    prune_weights(model)
    fine_tune(model)
    prunereg.save_pretrained(model, tmp_path)
    loaded = prunereg.from_pretrained(type(model), tmp_path).eval()
    torch.testing.assert_close(logits(loaded), logits(model))
    assert masks(loaded).keys() == masks(model).keys()
    for name, mask in masks(model).items():
        assert torch.equal(masks(loaded)[name], mask)
    fine_tune(loaded)  # fine-tuning goes on with the pruning kept
    for name, mask in masks(loaded).items():
        weight = loaded.get_submodule(name.rpartition(".")[0]).weight
        assert bool((weight[mask == 0] == 0).all())


@pytest.mark.parametrize("kind", MODELS)
def test_plain_from_pretrained_of_prunereg_save_has_the_pruned_values(kind, tmp_path):
    model = build(kind)
    prune_weights(model)
    prunereg.save_pretrained(model, tmp_path)
    plain = type(model).from_pretrained(tmp_path).eval()
    assert not prunereg.is_pruned(plain)
    torch.testing.assert_close(logits(plain), logits(model))


@pytest.mark.parametrize("kind", MODELS)
def test_a_folder_saved_by_plain_save_pretrained_is_restored(kind, tmp_path):
    model = build(kind)
    prune_weights(model)
    model.save_pretrained(tmp_path)
    loaded = prunereg.from_pretrained(type(model), tmp_path).eval()
    torch.testing.assert_close(logits(loaded), logits(model))
    assert masks(loaded).keys() == masks(model).keys()


def test_plain_from_pretrained_of_a_pruned_save_loses_the_weights(tmp_path):
    """What prunereg.from_pretrained avoids: transformers initialises the pruned weights anew."""
    model = build("gpt2")
    torch_prune.l1_unstructured(model.transformer.h[0].mlp.c_fc, "weight", amount=0.5)
    model.save_pretrained(tmp_path)
    plain = type(model).from_pretrained(tmp_path).eval()
    assert not torch.allclose(logits(plain), logits(model))


@pytest.mark.parametrize("kind", MODELS)
def test_save_and_reload_after_remove(kind, tmp_path):
    model = build(kind)
    for name in prune_weights(model):
        if prunereg.is_pruned(model.get_submodule(name.rpartition(".")[0])):
            prunereg.remove(model, name)
    assert not prunereg.is_pruned(model)
    model.save_pretrained(tmp_path)
    plain = type(model).from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(plain), logits(model))
    assert not (Path(tmp_path) / "prunereg_masks.safetensors").exists()


def test_gpt2_tied_head_and_embedding_stay_one_parameter(tmp_path):
    model = build("gpt2")
    prune_weights(model)
    assert model.lm_head.weight_orig is model.transformer.wte.weight_orig
    assert torch.equal(model.lm_head.weight, model.transformer.wte.weight)
    fine_tune(model)
    assert torch.equal(model.lm_head.weight, model.transformer.wte.weight)
    prunereg.save_pretrained(model, tmp_path)
    loaded = prunereg.from_pretrained(type(model), tmp_path)
    assert loaded.lm_head.weight_orig is loaded.transformer.wte.weight_orig
    prunereg.remove(loaded, "lm_head.weight")
    assert loaded.lm_head.weight is loaded.transformer.wte.weight


def test_pruning_the_head_alone_is_refused_at_save(tmp_path):
    model = build("gpt2")
    torch_prune.l1_unstructured(model.lm_head, "weight", amount=0.5)  # prunereg refuses to split the tie this way
    with pytest.raises(ValueError, match=r"lm_head\.weight is pruned but transformer\.wte\.weight"):
        prunereg.save_pretrained(model, tmp_path)
    assert not any(Path(tmp_path).iterdir())


def test_torch_splits_the_tied_gpt2_head():
    model = build("gpt2")
    torch_prune.l1_unstructured(model.lm_head, "weight", amount=0.5)
    assert not torch.equal(model.lm_head.weight, model.transformer.wte.weight)


def test_load_state_dict_of_a_saved_pruned_folder_into_an_unpruned_model(tmp_path):
    import safetensors.torch

    model = build("llama")
    prune_weights(model)
    model.save_pretrained(tmp_path)
    state = safetensors.torch.load_file(str(Path(tmp_path) / "model.safetensors"))
    fresh = build("llama")
    prunereg.load_state_dict(fresh, state, strict=False)
    torch.testing.assert_close(logits(fresh), logits(model))


logging.getLogger("transformers").setLevel(logging.ERROR)
