"""global_unstructured's streamed threshold search: torch's masks, bounded memory, nothing concatenated."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg.prune as prune
from prunereg._selection import select


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stream even tiny models, in blocks of 5 entries."""
    monkeypatch.setitem(select.TOPK_CUTOFF, "cpu", 1)
    monkeypatch.setattr(select, "BLOCK", 5)


@pytest.fixture
def no_concatenation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if anything larger than a histogram is concatenated."""
    real_cat = torch.cat

    def small_cat(tensors, *args, **kwargs):
        assert sum(t.numel() for t in tensors) <= 1 << 17, "global pruning concatenated tensors"
        return real_cat(tensors, *args, **kwargs)

    monkeypatch.setattr(torch, "cat", small_cat)


def model(dtype: torch.dtype = torch.float64, seed: int = 0) -> nn.Sequential:
    """Layers whose entries (weights and biases) are distinct in magnitude: no ties anywhere."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(9, 7), nn.Linear(7, 5), nn.Linear(5, 3)).to(dtype)
    params = list(net.parameters())
    total = sum(p.numel() for p in params)
    values = (torch.randperm(total).to(dtype) + 1) / total * (torch.randint(0, 2, (total,)) * 2 - 1).to(dtype)
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(values, params)
    return net


def pairs(net: nn.Module) -> list[tuple[nn.Module, str]]:
    return [(m, n) for m in net for n in ("weight", "bias")]


def prune_both(method: str, amount, *, dtype=torch.float64, before=None, scores=None):
    """The same global pruning by torch and by prunereg, from the same seed; returns both models."""
    mine, theirs = model(dtype), model(dtype)
    if before is not None:
        before(prune, mine)
        before(torch_prune, theirs)
    torch.manual_seed(11)
    torch_prune.global_unstructured(
        pairs(theirs), getattr(torch_prune, method), amount=amount, importance_scores=scores(theirs) if scores else None
    )
    torch_state = torch.get_rng_state()
    torch.manual_seed(11)
    prune.global_unstructured(
        pairs(mine), getattr(prune, method), amount=amount, importance_scores=scores(mine) if scores else None
    )
    assert torch.equal(torch.get_rng_state(), torch_state), "random draws differ from torch's"
    return mine, theirs


def assert_same_state(mine: nn.Module, theirs: nn.Module) -> None:
    a, b = mine.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("method", ["L1Unstructured", "RandomUnstructured"])
@pytest.mark.parametrize("amount", [0, 1, 0.3, 0.5, 0.99, 1.0, 100])
def test_streamed_masks_are_torchs(streamed, no_concatenation, method, amount):
    mine, theirs = prune_both(method, amount)
    assert_same_state(mine, theirs)


@pytest.mark.parametrize("method", ["L1Unstructured", "RandomUnstructured"])
def test_only_the_remaining_entries_compete(streamed, no_concatenation, method):
    def before(lib, net):
        lib.l1_unstructured(net[0], "weight", amount=0.4)
        lib.random_unstructured(net[2], "bias", amount=1)

    mine, theirs = prune_both(method, 0.5, before=before)
    assert_same_state(mine, theirs)


def test_importance_scores_of_any_dtype_rank_in_the_promoted_dtype(streamed):
    def scores(net):
        torch.manual_seed(2)
        return {(m, n): torch.randn(getattr(m, n).shape, dtype=torch.float32) for m, n in pairs(net)}

    mine, theirs = prune_both("L1Unstructured", 0.4, scores=scores)
    assert_same_state(mine, theirs)


@pytest.mark.parametrize("method", ["L1Unstructured", "RandomUnstructured"])
def test_float32_model_past_the_real_cutoff_is_torchs(no_concatenation, method):
    """No monkeypatching: 2 x 200 x 100 float32 entries go through the streamed search as shipped."""

    def big(seed):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(200, 100, bias=False), nn.Linear(100, 200, bias=False))
        total = 40_000
        values = (torch.randperm(total).float() + 1) / total
        torch.nn.utils.vector_to_parameters(values, net.parameters())
        return net

    mine, theirs = big(0), big(0)
    assert sum(p.numel() for p in mine.parameters()) > select.TOPK_CUTOFF["cpu"]
    torch.manual_seed(4)
    torch_prune.global_unstructured([(m, "weight") for m in theirs], getattr(torch_prune, method), amount=0.6)
    torch.manual_seed(4)
    prune.global_unstructured([(m, "weight") for m in mine], getattr(prune, method), amount=0.6)
    assert_same_state(mine, theirs)


@pytest.mark.parametrize("method", ["L1Unstructured", "RandomUnstructured"])
def test_exactly_k_pruned_under_ties(streamed, method):
    net = nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 3)).to(torch.bfloat16)
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(0.5)
    prune.global_unstructured(pairs(net), getattr(prune, method), amount=17)
    assert sum(int((getattr(m, n + "_mask") == 0).sum()) for m, n in pairs(net)) == 17
    # Ties are broken by position: the first parameters' first entries go first.
    if method == "L1Unstructured":
        assert int((net[0].weight_mask == 0).sum()) == 17


def test_each_parameter_keeps_only_its_own_mask(streamed):
    net = model()
    prune.global_unstructured(pairs(net), prune.L1Unstructured, amount=0.5)
    for module, name in pairs(net):
        mask = getattr(module, name + "_mask")
        (hook,) = [h for h in module._forward_pre_hooks.values() if h._tensor_name == name]
        assert hook.mask is mask  # the first pruning's share is the mask buffer itself: nothing else alive


def prune_largest(base: type) -> type:
    """A third-party method (on prunereg's or torch's base class): prune the largest magnitudes."""

    class PruneLargest(base):
        PRUNING_TYPE = "unstructured"

        def __init__(self, amount):
            self.amount = amount

        def compute_mask(self, t, default_mask):
            mask = default_mask.clone()
            mask[torch.topk(t.abs(), self.amount).indices] = 0
            return mask

    return PruneLargest


def test_third_party_methods_see_the_remaining_entries_concatenated(streamed):
    mine, theirs = model(), model()
    prune.l1_unstructured(mine[0], "weight", 0.5)
    torch_prune.l1_unstructured(theirs[0], "weight", 0.5)
    prune.global_unstructured(pairs(mine), prune_largest(prune.BasePruningMethod), amount=9)
    torch_prune.global_unstructured(pairs(theirs), prune_largest(torch_prune.BasePruningMethod), amount=9)
    assert_same_state(mine, theirs)


def test_failure_on_one_parameter_prunes_none(streamed):
    net = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(TypeError):
        prune.global_unstructured([(net[0], "weight"), (net[1], "running_mean")], prune.L1Unstructured, amount=2)
    assert not prune.is_pruned(net)
    assert net.state_dict().keys() == before.keys()


def test_too_large_an_amount_changes_nothing(streamed):
    net = model()
    state = torch.get_rng_state()
    with pytest.raises(ValueError):
        prune.global_unstructured(pairs(net), prune.RandomUnstructured, amount=10_000)
    assert not prune.is_pruned(net)
    assert torch.equal(torch.get_rng_state(), state)


def test_meta_parameters_get_meta_masks(streamed):
    net = nn.Sequential(nn.Linear(9, 7), nn.Linear(7, 5)).to("meta")
    prune.global_unstructured(pairs(net), prune.L1Unstructured, amount=0.5)
    assert net[0].weight_mask.is_meta and net[1].bias_mask.shape == (5,)


def test_meta_and_real_parameters_cannot_be_mixed(streamed):
    net = nn.Sequential(nn.Linear(9, 7), nn.Linear(7, 5, device="meta"))
    with pytest.raises(TypeError, match="meta"):
        prune.global_unstructured(pairs(net), prune.L1Unstructured, amount=0.5)
    assert not prune.is_pruned(net)


def test_parameters_on_any_device_give_the_cpu_masks(streamed, device):
    if device == "meta":
        pytest.skip("meta has its own test")
    mine, reference = model(), model()
    mine[1].to(device)
    torch.manual_seed(1)
    prune.global_unstructured(pairs(mine), prune.L1Unstructured, amount=0.5)
    torch.manual_seed(1)
    prune.global_unstructured(pairs(reference), prune.L1Unstructured, amount=0.5)
    mine.to("cpu")
    assert_same_state(mine, reference)


def ranked(ranked_by: str | None) -> type:
    """A third-party unstructured method built on the toolkit, declaring how it ranks entries."""
    from prunereg import toolkit

    class Ranked(prune.BasePruningMethod):
        """Prune the entries the toolkit ranks first."""

        PRUNING_TYPE = "unstructured"
        RANKED_BY = ranked_by

        def __init__(self, amount):
            toolkit.check_amount(amount)
            self.amount = amount

        def compute_mask(self, t, default_mask):
            k = toolkit.count_to_prune(self.amount, t.numel())
            if ranked_by == "random":
                return toolkit.prune_lowest(toolkit.rand_like(t), k, default_mask, largest=True)
            return toolkit.prune_lowest(t, k, default_mask, magnitude=True)

    return Ranked


@pytest.mark.parametrize(
    ("ranked_by", "torch_method"), [("magnitude", "L1Unstructured"), ("random", "RandomUnstructured")]
)
@pytest.mark.parametrize("amount", [1, 0.5, 100])
def test_a_registered_third_party_method_declaring_its_ranking_streams(
    streamed, fresh_registry, monkeypatch, ranked_by, torch_method, amount
):
    import prunereg

    prunereg.register(f"ranked_by_{ranked_by}")(ranked(ranked_by))
    method = prunereg.get(f"ranked_by_{ranked_by}")
    mine, theirs = model(), model()
    prune.l1_unstructured(mine[1], "weight", 0.5)
    torch_prune.l1_unstructured(theirs[1], "weight", 0.5)
    torch.manual_seed(5)
    torch_prune.global_unstructured(pairs(theirs), getattr(torch_prune, torch_method), amount=amount)
    torch.manual_seed(5)
    with monkeypatch.context() as patch:  # the streamed path concatenates nothing; torch's way would
        patch.setattr(torch, "cat", lambda *args, **kwargs: pytest.fail("the entries were concatenated"))
        prune.global_unstructured(pairs(mine), method, amount=amount)
    assert_same_state(mine, theirs)


def test_an_unknown_ranking_is_refused_and_changes_nothing(streamed):
    net = model()
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(ValueError, match="RANKED_BY"):
        prune.global_unstructured(pairs(net), ranked("alphabetical"), amount=3)
    assert not prune.is_pruned(net)
    assert all(torch.equal(net.state_dict()[key], value) for key, value in before.items())
