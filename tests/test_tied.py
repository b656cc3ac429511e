"""Parameters shared by several modules (an LM head tied to its embedding) are pruned consistently or not at all."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg
import prunereg.prune as prune


class TiedLM(nn.Module):
    """An embedding and an output head holding one Parameter, as Hugging Face ties them."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 6)
        self.body = nn.Linear(6, 6)
        self.head = nn.Linear(6, 12, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(self.embed(ids))))


def tied_lm(seed: int = 0) -> TiedLM:
    torch.manual_seed(seed)
    return TiedLM()


IDS = torch.tensor([[1, 4, 7, 10], [0, 2, 3, 11]])


def train(model: nn.Module, steps: int = 3) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(IDS).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_torch_leaves_the_embedding_unpruned():
    model = tied_lm()
    torch_prune.l1_unstructured(model.head, "weight", amount=0.5)
    assert not torch.equal(model.head.weight, model.embed.weight)


@pytest.mark.parametrize("name", ["head.weight", "embed.weight"])
def test_naming_the_parameter_from_the_model_prunes_every_use(name):
    model = tied_lm()
    prune.l1_unstructured(model, name, amount=0.5)
    assert model.head.weight_orig is model.embed.weight_orig
    assert torch.equal(model.head.weight, model.embed.weight)
    assert int((model.embed.weight == 0).sum()) == 36
    train(model)
    assert torch.equal(model.head.weight, model.embed.weight)
    assert int((model.embed.weight == 0).sum()) >= 36


def test_the_mask_is_torchs_mask_for_that_parameter():
    model, reference = tied_lm(), tied_lm()
    prune.l1_unstructured(model, "head.weight", amount=0.4)
    torch_prune.l1_unstructured(reference.head, "weight", amount=0.4)
    assert torch.equal(model.head.weight_mask, reference.head.weight_mask)
    assert torch.equal(model.embed.weight_mask, reference.head.weight_mask)


def test_pruning_again_from_the_model_keeps_the_group_consistent():
    model = tied_lm()
    prune.l1_unstructured(model, "head.weight", amount=0.5)
    prune.random_unstructured(model, "embed.weight", amount=0.25)
    assert torch.equal(model.head.weight_mask, model.embed.weight_mask)
    assert int((model.head.weight_mask == 0).sum()) == 36 + 9


def test_pruning_one_member_alone_is_refused_and_changes_nothing():
    model = tied_lm()
    prune.l1_unstructured(model, "head.weight", amount=0.5)
    before = copy.deepcopy(model.state_dict())
    hooks = dict(model.head._forward_pre_hooks)
    with pytest.raises(ValueError, match=r"head\.weight shares its parameter with embed\.weight"):
        prune.l1_unstructured(model.head, "weight", amount=0.2)
    assert dict(model.head._forward_pre_hooks) == hooks
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])


def test_remove_from_the_model_makes_every_use_permanent_and_keeps_the_tie():
    model = tied_lm()
    prune.l1_unstructured(model, "head.weight", amount=0.5)
    pruned = model.head.weight.detach().clone()
    prunereg.remove(model, "head.weight")
    assert not prunereg.is_pruned(model)
    assert model.head.weight is model.embed.weight
    assert torch.equal(model.embed.weight, pruned)


def test_remove_of_one_member_leaves_both_with_the_pruned_values():
    model = tied_lm()
    prune.l1_unstructured(model, "head.weight", amount=0.5)
    pruned = model.head.weight.detach().clone()
    prunereg.remove(model.head, "weight")
    model(IDS)
    assert torch.equal(model.head.weight, pruned) and torch.equal(model.embed.weight, pruned)


def test_state_dict_round_trip_of_a_tied_pruned_model():
    model = tied_lm()
    prune.l1_unstructured(model, "head.weight", amount=0.5)
    train(model, steps=1)
    state = model.state_dict()
    pruned = model.head.weight_orig.detach() * model.head.weight_mask

    into_plain = tied_lm(seed=1)
    prunereg.load_state_dict(into_plain, state)
    assert into_plain.head.weight is into_plain.embed.weight
    assert torch.equal(into_plain.head.weight, pruned)

    into_pruned = tied_lm(seed=1)
    prune.l1_unstructured(into_pruned, "head.weight", amount=0.1)
    prunereg.load_state_dict(into_pruned, state)
    assert torch.equal(into_pruned(IDS), model(IDS))


def test_untied_parameters_are_pruned_alone():
    model = tied_lm()
    prune.l1_unstructured(model, "body.weight", amount=0.5)
    assert not hasattr(model.head, "weight_orig")
    assert prunereg.is_pruned(model.body) and not prunereg.is_pruned(model.embed)


def test_a_dotted_name_is_the_same_as_pruning_the_submodule():
    model, reference = tied_lm(), tied_lm()
    prune.ln_structured(model, "body.weight", amount=2, n=1, dim=0)
    torch_prune.ln_structured(reference.body, "weight", amount=2, n=1, dim=0)
    assert torch.equal(model.body.weight, reference.body.weight)
    assert torch.equal(model(IDS), reference(IDS))


def test_a_dotted_name_that_does_not_exist_changes_nothing():
    model = tied_lm()
    with pytest.raises(AttributeError):
        prune.l1_unstructured(model, "nothing.weight", amount=0.5)
    with pytest.raises(AttributeError):
        prune.l1_unstructured(model, "body.nothing", amount=0.5)
    assert not prunereg.is_pruned(model)


def test_deepcopy_of_a_tied_pruned_model_keeps_the_tie():
    model = tied_lm()
    prune.l1_unstructured(model, "head.weight", amount=0.5)
    clone = copy.deepcopy(model)
    assert clone.head.weight_orig is clone.embed.weight_orig
    train(clone)
    assert torch.equal(clone.head.weight, clone.embed.weight)
    assert torch.equal(clone.head.weight_mask, model.head.weight_mask)


def test_global_pruning_with_dotted_names_prunes_the_tied_parameter_everywhere():
    model, reference = tied_lm(), tied_lm()
    prune.global_unstructured([(model, "head.weight"), (model, "body.weight")], prune.L1Unstructured, amount=0.5)
    torch_prune.global_unstructured(
        [(reference.head, "weight"), (reference.body, "weight")], torch_prune.L1Unstructured, amount=0.5
    )
    assert torch.equal(model.head.weight_mask, reference.head.weight_mask)
    assert torch.equal(model.body.weight_mask, reference.body.weight_mask)
    assert torch.equal(model.embed.weight_mask, model.head.weight_mask)
    assert model.embed.weight_orig is model.head.weight_orig
    with pytest.raises(ValueError, match="shares its parameter"):
        prune.global_unstructured([(model.head, "weight")], prune.L1Unstructured, amount=0.1)
