"""The calls around pruning a whole model: what to prune, pruning it globally by name, making it permanent."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg
import prunereg.prune as prune
from tests.support.tiny_lm import VOCAB, tiny_gpt2, tiny_llama


def _names(model: nn.Module, pairs: list[tuple[nn.Module, str]]) -> list[str]:
    paths = {id(module): path for path, module in model.named_modules()}
    return [f"{paths[id(module)]}.{name}".lstrip(".") for module, name in pairs]


def test_parameters_to_prune_on_gpt2_are_the_block_weights_and_not_the_tied_head():
    pytest.importorskip("transformers")
    model = tiny_gpt2()
    names = _names(model, prunereg.parameters_to_prune(model))
    assert names == [
        f"transformer.h.{i}.{part}.weight"
        for i in range(2)
        for part in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    ]


def test_parameters_to_prune_on_llama_with_tied_embeddings_leave_out_embedding_norms_and_head():
    pytest.importorskip("transformers")
    model = tiny_llama(tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    names = _names(model, prunereg.parameters_to_prune(model))
    projections = ("q_proj", "k_proj", "v_proj", "o_proj")
    assert names == [
        f"model.layers.{i}.{part}.weight"
        for i in range(2)
        for part in (*(f"self_attn.{p}" for p in projections), "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    ]
    assert not any("embed" in name or "norm" in name or "lm_head" in name for name in names)


def test_parameters_to_prune_ignore_globs_on_module_names():
    pytest.importorskip("transformers")
    model = tiny_llama()
    names = _names(model, prunereg.parameters_to_prune(model, ignore=["*.mlp.*", "model.layers.1.*"]))
    assert names == [f"model.layers.0.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]


@pytest.mark.parametrize("build", [tiny_gpt2, lambda: tiny_llama(tie_word_embeddings=True)], ids=["gpt2", "llama"])
def test_global_pruning_of_parameters_to_prune_by_a_registered_name(build):
    pytest.importorskip("transformers")
    model = build()
    pairs = prunereg.parameters_to_prune(model)
    prune.global_unstructured(pairs, pruning_method="l1_unstructured", amount=0.5)
    zeros = sum(int((getattr(m, n) == 0).sum()) for m, n in pairs)
    total = sum(getattr(m, n).numel() for m, n in pairs)
    assert zeros == total // 2
    model(torch.randint(0, VOCAB, (1, 8)))  # still runs
    pruned = [row.name for row in prunereg.summary(model).rows if row.pruned_by]
    assert pruned == _names(model, pairs)  # the embedding and the head tied to it untouched


def test_a_pruned_parameter_is_listed_under_its_own_name():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    assert _names(model, prunereg.parameters_to_prune(model)) == ["0.weight", "2.weight"]


def test_two_prunable_attributes_sharing_a_tensor_are_one_dotted_pair():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight
    assert prunereg.parameters_to_prune(model) == [(model, "0.weight")]
    prune.global_unstructured(prunereg.parameters_to_prune(model), pruning_method="l1_unstructured", amount=0.5)
    assert torch.equal(model[0].weight, model[1].weight)


def test_global_pruning_by_an_unknown_or_calibrated_name_is_refused():
    model = nn.Linear(4, 4)
    with pytest.raises(prunereg.UnknownMethodError):
        prunereg.global_unstructured([(model, "weight")], pruning_method="l2_unstructurd", amount=0.5)
    with pytest.raises(TypeError):
        prunereg.global_unstructured([(model, "weight")], pruning_method="ln_structured", amount=0.5, n=2, dim=0)
    assert not prunereg.is_pruned(model)


@pytest.mark.parametrize("method", [prune.L1Unstructured, "l1_unstructured", prune.RandomUnstructured])
def test_summary_names_the_method_global_pruning_was_asked_for(method):
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    prune.global_unstructured([(model[0], "weight"), (model[1], "weight")], pruning_method=method, amount=0.5)
    asked = "random_unstructured" if method is prune.RandomUnstructured else "l1_unstructured"
    rows = {row.name: row.pruned_by for row in prunereg.summary(model).rows}
    assert rows["0.weight"] == (asked,) and rows["1.weight"] == (asked,)
    prune.l1_unstructured(model[0], "weight", amount=0.25)
    prune.custom_from_mask(model[1], "weight", torch.ones(2, 4))
    rows = {row.name: row.pruned_by for row in prunereg.summary(model).rows}
    assert rows["0.weight"] == (asked, "l1_unstructured")
    assert rows["1.weight"] == (asked, "custom_from_mask")  # a mask the user gave is named as such


def test_make_pruning_permanent_removes_every_pruning_in_the_model():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Embedding(5, 4))
    model[3].weight = model[2].weight  # tied: pruned together, removed once
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    prune.l1_unstructured(model[0], "bias", amount=0.5)
    prune.ln_structured(model, "2.weight", amount=1, n=2, dim=0)
    torch_prune.random_unstructured(model[2], "bias", amount=0.5)  # torch's own hook
    expected = {name: tensor.detach().clone() for name, tensor in _effective(model).items()}
    returned = prunereg.make_pruning_permanent(model)
    assert returned is model and not prunereg.is_pruned(model)
    assert set(dict(model.named_parameters())) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert model[3].weight is model[2].weight and isinstance(model[2].weight, nn.Parameter)
    for name, tensor in _effective(model).items():
        assert torch.equal(tensor, expected[name])
    assert not any(n.endswith("_mask") for n, _ in model.named_buffers())
    assert prunereg.make_pruning_permanent(model) is model  # nothing pruned: nothing to do


def _effective(model: nn.Module) -> dict[str, torch.Tensor]:
    return {f"{index}.{name}": getattr(model[index], name) for index in (0, 2) for name in ("weight", "bias")}
