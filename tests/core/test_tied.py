"""Parameters shared by several modules (an LM head tied to its embedding) are pruned consistently or not at all."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg
import prunereg.prune as prune
from prunereg._core import tied as _tied


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


def snapshot(model: nn.Module) -> tuple[list[str], dict[str, int], dict[str, list[int]], dict[str, torch.Tensor]]:
    """What pruning would change: state_dict keys, each parameter's identity, each module's hooks, every value."""
    state = model.state_dict(keep_vars=True)
    return (
        list(state),
        {name: id(parameter) for name, parameter in model.named_parameters(remove_duplicate=False)},
        {name: [id(hook) for hook in module._forward_pre_hooks.values()] for name, module in model.named_modules()},
        {key: value.detach().clone() for key, value in state.items()},
    )


def assert_unchanged(model: nn.Module, before: tuple) -> None:
    keys, identities, hooks, values = snapshot(model)
    assert (keys, identities, hooks) == before[:3]
    for key, value in values.items():
        assert torch.equal(value, before[3][key]), key


PRUNE_ONE = {
    "l1_unstructured": lambda module, name: prune.l1_unstructured(module, name, amount=0.5),
    "random_structured": lambda module, name: prune.random_structured(module, name, amount=1, dim=0),
    "identity": prune.identity,
    "custom_from_mask": lambda module, name: prune.custom_from_mask(
        module, name, torch.ones_like(getattr(module, name))
    ),
}


@pytest.mark.parametrize("how", PRUNE_ONE)
@pytest.mark.parametrize(("side", "other"), [("head", r"Embedding\.weight"), ("embed", r"Linear\.weight")])
def test_pruning_one_side_of_a_tie_directly_is_refused_and_changes_nothing(how, side, other):
    model = tied_lm()
    before = snapshot(model)
    with pytest.raises(ValueError, match=rf"shares its Parameter with {other}, outside .*dotted name"):
        PRUNE_ONE[how](getattr(model, side), "weight")
    assert_unchanged(model, before)
    assert model.head.weight is model.embed.weight


def test_a_tie_reaching_outside_the_module_given_is_refused():
    model = nn.Sequential(tied_lm())
    outer = nn.Linear(6, 12, bias=False)
    outer.weight = model[0].embed.weight
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"Linear\.weight, outside the Sequential given"):
        prune.l1_unstructured(model, "0.head.weight", amount=0.5)
    assert_unchanged(model, before)


def test_a_tie_that_torch_split_is_not_pruned_further_on_one_side():
    model = tied_lm()
    torch_prune.l1_unstructured(model.head, "weight", amount=0.5)  # head.weight now has an autograd graph
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"shares its Parameter with Embedding\.weight"):
        prune.l1_unstructured(model.head, "weight", amount=0.2)
    with pytest.raises(ValueError, match=r"shares its Parameter with Linear\.weight_orig"):
        prune.l1_unstructured(model.embed, "weight", amount=0.2)
    assert_unchanged(model, before)


class CountingScans:
    """Records the calls of gc.get_referrers that prunereg's tie check makes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import gc

        self.scanned_for: list[int] = []  # how many objects each scan looked for
        real = gc.get_referrers

        def counted(*objects: object) -> list:
            self.scanned_for.append(len(objects))
            return real(*objects)

        monkeypatch.setattr("prunereg._core.tied.gc.get_referrers", counted)


def test_a_parameter_only_its_module_holds_is_pruned_without_a_scan(monkeypatch):
    model = tied_lm()
    scans = CountingScans(monkeypatch)
    prune.l1_unstructured(model.body, "weight", amount=0.5)
    prune.l1_unstructured(model.body, "weight", amount=0.5)  # again: its pruned tensor's graph holds it too
    with torch.no_grad():
        prune.l1_unstructured(model.body, "bias", amount=0.5)
        prune.l1_unstructured(model.body, "bias", amount=0.5)
    assert scans.scanned_for == []


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam])
def test_an_untied_parameter_an_optimizer_holds_is_scanned_and_pruned(monkeypatch, optimizer):
    model, reference = tied_lm(), tied_lm()
    held = optimizer(model.parameters(), lr=0.1)
    model(IDS).square().mean().backward()
    held.step()  # Adam's state now holds the parameters too
    reference.load_state_dict(model.state_dict())
    named = dict(model.named_parameters())  # a dict holding it that is not a module's
    scans = CountingScans(monkeypatch)
    prune.l1_unstructured(model.body, "weight", amount=0.5)
    torch_prune.l1_unstructured(reference.body, "weight", amount=0.5)
    assert scans.scanned_for[0] == 1
    assert torch.equal(model.body.weight_mask, reference.body.weight_mask)
    assert named["body.weight"] is model.body.weight_orig
    assert any(parameter is model.body.weight_orig for parameter in held.param_groups[0]["params"])


def test_global_pruning_over_one_side_of_a_tie_is_refused_and_changes_nothing(monkeypatch):
    model = tied_lm()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = snapshot(model)
    scans = CountingScans(monkeypatch)
    with pytest.raises(ValueError, match=r"Linear\.weight shares its Parameter with Embedding\.weight"):
        prune.global_unstructured(
            [(model.body, "weight"), (model.body, "bias"), (model.head, "weight")], prune.L1Unstructured, amount=0.5
        )
    assert_unchanged(model, before)
    assert scans.scanned_for[0] == 3  # one scan for every parameter the optimizer holds
    assert len(optimizer.param_groups[0]["params"]) == 3


def gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=2, n_positions=16)
    return transformers.GPT2LMHeadModel(config)


def linear_names(model: nn.Module) -> list[str]:
    from transformers.pytorch_utils import Conv1D

    return [name for name, module in model.named_modules() if isinstance(module, (nn.Linear, Conv1D))]


@pytest.mark.parametrize("together", [False, True], ids=["one-by-one", "global"])
def test_gpt2_pruned_through_its_modules_refuses_the_tied_head_and_changes_nothing(together):
    model = gpt2()
    names = linear_names(model)
    assert names[-1] == "lm_head"
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"Linear\.weight shares its Parameter with Embedding\.weight"):
        if together:
            targets = [(model.get_submodule(name), "weight") for name in names]
            prune.global_unstructured(targets, prune.L1Unstructured, amount=0.5)
        else:
            prune.l1_unstructured(model.lm_head, "weight", amount=0.5)
    assert_unchanged(model, before)


@pytest.mark.parametrize("together", [False, True], ids=["one-by-one", "global"])
def test_gpt2_pruned_by_dotted_names_keeps_the_tie(together):
    model = gpt2()
    torch.optim.AdamW(model.parameters())
    names = [f"{name}.weight" for name in linear_names(model)]
    if together:
        prune.global_unstructured([(model, name) for name in names], prune.L1Unstructured, amount=0.5)
    else:
        for name in names:
            prune.l1_unstructured(model, name, amount=0.5)
    wte = model.transformer.wte
    assert model.lm_head.weight_orig is wte.weight_orig
    assert torch.equal(model.lm_head.weight_mask, wte.weight_mask) and bool((wte.weight_mask == 0).any())
    model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    assert torch.equal(model.lm_head.weight, wte.weight)


def test_a_tie_pruned_from_the_model_needs_no_scan(monkeypatch):
    model = tied_lm()
    scans = CountingScans(monkeypatch)
    prune.l1_unstructured(model, "head.weight", amount=0.5)
    prune.l1_unstructured(model, "embed.weight", amount=0.2)
    prune.global_unstructured([(model, "head.weight"), (model, "body.weight")], prune.L1Unstructured, amount=0.3)
    assert scans.scanned_for == []
    assert torch.equal(model.head.weight_mask, model.embed.weight_mask)


def test_a_module_used_twice_counts_once_when_looking_for_outside_holders():
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    outside = nn.Linear(4, 4)
    outside.weight = shared.weight
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"Linear\.weight, outside the Sequential given"):
        prune.l1_unstructured(model, "0.weight", amount=0.5)
    assert_unchanged(model, before)


def test_apply_masks_prunes_a_tied_parameter_everywhere(monkeypatch):
    model = tied_lm()
    mask = (torch.rand(12, 6, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    scans = CountingScans(monkeypatch)
    prunereg.apply_masks(model, {"embed.weight": mask, "body.weight": torch.ones(6, 6), "body.bias": torch.ones(6)})
    assert scans.scanned_for == []  # apply_masks' own all_or_nothing snapshots are accounted for
    assert model.head.weight_orig is model.embed.weight_orig
    assert torch.equal(model.head.weight_mask, mask) and torch.equal(model.embed.weight_mask, mask)
    assert torch.equal(model.head.weight, model.embed.weight)


def test_inside_all_or_nothing_one_side_of_a_tie_is_still_refused():
    from prunereg.toolkit import all_or_nothing

    model = tied_lm()
    before = snapshot(model)
    with (
        pytest.raises(ValueError, match=r"shares its Parameter with Embedding\.weight"),
        all_or_nothing([(model.head, "weight"), (model.body, "weight")]),
    ):
        prune.l1_unstructured(model.body, "weight", amount=0.5)
        prune.l1_unstructured(model.head, "weight", amount=0.5)
    assert_unchanged(model, before)


def test_the_check_leaves_the_random_stream_as_torch_would(monkeypatch):
    monkeypatch.setattr("prunereg._core.tied._own_references", functools.cache(_tied._own_references.__wrapped__))
    ours, theirs = nn.Linear(8, 8), nn.Linear(8, 8)
    theirs.load_state_dict(ours.state_dict())
    torch.manual_seed(1)
    prune.random_unstructured(ours, "weight", amount=0.5)  # the first check measures its reference counts
    torch.manual_seed(1)
    torch_prune.random_unstructured(theirs, "weight", amount=0.5)
    assert torch.equal(ours.weight_mask, theirs.weight_mask)
