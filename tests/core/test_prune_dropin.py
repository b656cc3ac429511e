"""prunereg.prune against torch.nn.utils.prune, run side by side on the same inputs and seed.

Every comparison builds one module per implementation, prunes both the same
way after the same ``torch.manual_seed``, and checks masks (values, dtype,
device), pruned tensors, hook structure, ordered state_dict keys, gradients on
``<name>_orig``, pickle and torch.save round trips, and error types.
Inputs are tie-free at the pruning boundary (see ``tests.support.inputs``): where torch's
``topk`` meets ties its choice is arbitrary, and there only the count is promised.
"""

from __future__ import annotations

import io
import math
import pickle

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from torch import nn

import prunereg.prune as ours_prune
from tests.support.inputs import (
    FLOAT_DTYPES,
    assert_same_tensor,
    distinct_values,
    normal_values,
    shapes,
    ties_at_boundary,
)

IMPLEMENTATIONS = {"torch": torch_prune, "prunereg": ours_prune}
NORMS = [1, 2, math.inf, -math.inf, "fro"]
METHODS = [
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "custom_from_mask",
]


class Pair(nn.Module):
    """Two parameters, ``w`` and ``v``, and a forward that uses both."""

    def __init__(self, w: torch.Tensor, v: torch.Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(w.clone())
        self.v = nn.Parameter(v.clone())

    def forward(self, cw: torch.Tensor, cv: torch.Tensor) -> torch.Tensor:
        return (self.w * cw).sum() + (self.v * cv).sum()


def run_both(build, act, seed: int) -> dict[str, tuple[nn.Module, Exception | None]]:
    """``act(prune_module, module)`` on a fresh ``build()`` per implementation, after the same seed."""
    results = {}
    for label, implementation in IMPLEMENTATIONS.items():
        module = build()
        torch.manual_seed(seed)
        try:
            act(implementation, module)
        except Exception as error:  # any error: compared below
            results[label] = (module, error)
        else:
            results[label] = (module, None)
    return results


def assert_same_error(theirs: Exception | None, ours: Exception | None) -> None:
    """Both succeeded, or ours raised torch's error type (or a subclass of it)."""
    if theirs is None or ours is None:
        assert theirs is None and ours is None, (theirs, ours)
    else:
        assert isinstance(ours, type(theirs)), (type(theirs), type(ours), ours)


def hook_structure(module: nn.Module) -> list:
    """The pruning hooks of ``module`` by class name, containers as lists of their methods."""
    described = []
    for hook in module._forward_pre_hooks.values():
        methods = getattr(hook, "_pruning_methods", None)
        names = [type(m).__name__ for m in methods] if methods is not None else []
        described.append((hook._tensor_name, type(hook).__name__, names))
    return described


def assert_same_pruning(theirs: nn.Module, ours: nn.Module) -> None:
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert hook_structure(ours) == hook_structure(theirs)
    for key, value in theirs.state_dict().items():
        assert_same_tensor(ours.state_dict()[key], value)
    for hook in theirs._forward_pre_hooks.values():
        name = hook._tensor_name
        assert_same_tensor(getattr(ours, name).detach(), getattr(theirs, name).detach())


def assert_same_gradients(theirs: nn.Module, ours: nn.Module, *inputs: torch.Tensor) -> None:
    for module in (theirs, ours):
        module.zero_grad()
        module(*inputs).backward()
    ours_grads = {name: p.grad for name, p in ours.named_parameters()}
    for name, parameter in theirs.named_parameters():
        assert_same_tensor(ours_grads[name], parameter.grad)


def norm_ties(t: torch.Tensor, n, dim: int, k: int) -> bool:
    """Whether the ``k`` channels of lowest norm are ambiguous (False where the norm itself fails)."""
    try:
        norms = torch_prune._compute_norm(t, n, dim)
    except RuntimeError:  # e.g. 'fro' over three dims: both implementations raise it
        return False
    return ties_at_boundary(norms, k)


def amounts(units: int):
    """Amounts torch accepts at construction: ints up to one too many, floats in [0, 1]."""
    return st.one_of(
        st.integers(0, units + 1),
        st.floats(0.0, 1.0),
        st.sampled_from([0, 1, 0.0, 1.0]),
    )


# --- one pruning --------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    shape=shapes,
    dtype=st.sampled_from(FLOAT_DTYPES),
    method=st.sampled_from(METHODS),
    seed=st.integers(0, 2**16),
)
def test_one_pruning_matches_torch(data, shape, dtype, method, seed):
    ndim = len(shape)
    dim = data.draw(st.integers(-ndim, ndim - 1), label="dim")
    structured = method in ("random_structured", "ln_structured")
    units = shape[dim] if structured else math.prod(shape)
    amount = data.draw(amounts(units), label="amount")
    k = ours_prune._compute_nparams_toprune(amount, units)
    n = data.draw(st.sampled_from(NORMS), label="n")
    use_scores = data.draw(st.booleans(), label="importance_scores")
    scores_dtype = data.draw(st.sampled_from([dtype, torch.float32, torch.float64]), label="scores dtype")

    values = normal_values(shape, dtype, seed) if method == "ln_structured" else distinct_values(shape, dtype, seed)
    scores = None
    if use_scores and method in ("l1_unstructured", "ln_structured"):
        make = normal_values if method == "ln_structured" else distinct_values
        scores = make(shape, scores_dtype, seed + 1)
    ranked = values if scores is None else scores
    if method == "ln_structured" and ndim > 1 and k <= units:
        assume(not norm_ties(ranked, n, dim, k))
    if method == "random_unstructured" and k <= units:
        torch.manual_seed(seed)
        assume(not ties_at_boundary(-torch.rand_like(values), k))
    mask_dtype = data.draw(st.sampled_from([torch.bool, torch.int64, dtype]), label="mask dtype")
    custom = torch.randint(0, 2, shape, generator=torch.Generator().manual_seed(seed)).to(mask_dtype)

    def act(prune, module):
        if method == "identity":
            prune.identity(module, "w")
        elif method == "random_unstructured":
            prune.random_unstructured(module, "w", amount)
        elif method == "l1_unstructured":
            prune.l1_unstructured(module, "w", amount, importance_scores=scores)
        elif method == "random_structured":
            prune.random_structured(module, "w", amount, dim)
        elif method == "ln_structured":
            prune.ln_structured(module, "w", amount, n, dim, importance_scores=scores)
        else:
            prune.custom_from_mask(module, "w", custom)

    results = run_both(lambda: Pair(values, torch.ones(2, dtype=dtype)), act, seed)
    (theirs, their_error), (ours, our_error) = results["torch"], results["prunereg"]
    event(f"torch raised {type(their_error).__name__}" if their_error else "both pruned")
    assert_same_error(their_error, our_error)
    if their_error is None:
        assert_same_pruning(theirs, ours)
        coefficients = normal_values(shape, dtype, seed + 2), torch.ones(2, dtype=dtype)
        assert_same_gradients(theirs, ours, *coefficients)


# --- several prunings of one module: containers, global pruning, round trips -----------------

STEPS = ["identity", "l1", "random_unstructured", "ln", "random_structured", "custom", "global_l1", "global_random"]


def remaining_channels(module: nn.Module, dim: int) -> torch.Tensor:
    """The slices of ``module.w`` along ``dim`` that are not pruned whole."""
    mask = getattr(module, "w_mask", torch.ones_like(module.w))
    others = [d for d in range(mask.dim()) if d != dim % mask.dim()]
    keep = (mask.sum(dim=others) != 0).nonzero().flatten()
    return module.w.detach().index_select(dim, keep)


def remaining_entries(module: nn.Module, names: list[str]) -> int:
    return sum(int((getattr(module, n + "_mask", torch.ones_like(getattr(module, n))) == 1).sum()) for n in names)


@settings(max_examples=120, deadline=None)
@given(
    data=st.data(),
    shape=shapes.filter(lambda s: len(s) >= 2),
    v_size=st.integers(1, 6),
    steps=st.lists(st.sampled_from(STEPS), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_successive_prunings_match_torch(data, shape, v_size, steps, seed):
    # float64 random draws never tie at the boundary; float32 ones might.
    random = any(s in ("random_unstructured", "global_random") for s in steps)
    dtype = torch.float64 if random else data.draw(st.sampled_from([torch.float32, torch.float64]), label="dtype")
    both = normal_values((math.prod(shape) + v_size,), dtype, seed)
    w, v = both[: math.prod(shape)].reshape(shape), both[math.prod(shape) :]
    reference = Pair(w, v)  # a third copy, pruned by torch, to look ahead for ties
    torch.manual_seed(seed)  # the look-ahead's random draws must replay identically

    plan = []
    for step in steps:
        target = (
            data.draw(st.sampled_from(["w", "v"]), label="target")
            if step in ("l1", "random_unstructured", "identity")
            else "w"
        )
        dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
        n = data.draw(st.sampled_from(NORMS), label="n")
        if step in ("ln", "random_structured"):
            units = remaining_channels(reference, dim).shape[dim]
        elif step.startswith("global"):
            units = remaining_entries(reference, ["w", "v"])
        else:
            units = remaining_entries(reference, [target])
        amount = data.draw(amounts(units), label="amount")
        k = ours_prune._compute_nparams_toprune(amount, units)
        if step == "ln" and k <= units:
            assume(not norm_ties(remaining_channels(reference, dim), n, dim, k))
        mask = torch.randint(0, 2, shape, generator=torch.Generator().manual_seed(seed + len(plan)))
        plan.append((step, target, dim, n, amount, mask))
        try:
            apply_step(torch_prune, reference, plan[-1])
        except Exception:  # any error: the comparison below checks errors
            break

    def act(prune, module):
        for planned in plan:
            apply_step(prune, module, planned)

    results = run_both(lambda: Pair(w, v), act, seed)
    (theirs, their_error), (ours, our_error) = results["torch"], results["prunereg"]
    event(f"torch raised {type(their_error).__name__}" if their_error else "both pruned")
    assert_same_error(their_error, our_error)
    if their_error is not None:
        return  # torch leaves a half-pruned module behind; prunereg's rollback is tested elsewhere
    assert_same_pruning(theirs, ours)
    coefficients = normal_values(shape, dtype, seed + 1), normal_values((v_size,), dtype, seed + 2)
    assert_same_gradients(theirs, ours, *coefficients)
    assert_round_trips_agree(theirs, ours, coefficients)


def apply_step(prune, module: nn.Module, planned: tuple) -> None:
    step, target, dim, n, amount, mask = planned
    if step == "identity":
        prune.identity(module, target)
    elif step == "l1":
        prune.l1_unstructured(module, target, amount)
    elif step == "random_unstructured":
        prune.random_unstructured(module, target, amount)
    elif step == "ln":
        prune.ln_structured(module, "w", amount, n, dim)
    elif step == "random_structured":
        prune.random_structured(module, "w", amount, dim)
    elif step == "custom":
        prune.custom_from_mask(module, "w", mask)
    else:
        method = prune.L1Unstructured if step == "global_l1" else prune.RandomUnstructured
        prune.global_unstructured([(module, "w"), (module, "v")], method, amount=amount)


def assert_round_trips_agree(theirs: nn.Module, ours: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    """Pickle and torch.save copies of both agree with each other and with the originals."""
    for save, load in [(pickle.dumps, pickle.loads), (saved, lambda b: torch.load(io.BytesIO(b), weights_only=False))]:
        their_copy, our_copy = load(save(theirs)), load(save(ours))
        assert_same_pruning(their_copy, our_copy)
        assert torch.equal(our_copy(*inputs), ours(*inputs))
        assert_same_gradients(their_copy, our_copy, *inputs)


def saved(module: nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save(module, buffer)
    return buffer.getvalue()


# --- global pruning of several modules, with importance scores and earlier pruning ----------


@settings(max_examples=120, deadline=None)
@given(
    data=st.data(),
    tensor_shapes=st.lists(shapes, min_size=1, max_size=3).filter(lambda ss: sum(math.prod(s) for s in ss) <= 256),
    dtype=st.sampled_from(FLOAT_DTYPES),
    method=st.sampled_from(["l1", "random"]),
    seed=st.integers(0, 2**16),
)
def test_global_pruning_matches_torch(data, tensor_shapes, dtype, method, seed):
    total = sum(math.prod(s) for s in tensor_shapes)
    flat = distinct_values((total,), dtype, seed)
    pieces = torch.split(flat, [math.prod(s) for s in tensor_shapes])
    values = [p.reshape(s) for p, s in zip(pieces, tensor_shapes)]
    earlier = [data.draw(st.integers(0, math.prod(s)), label="pruned before") for s in tensor_shapes]
    scored = [data.draw(st.booleans(), label="has scores") for _ in tensor_shapes]
    scores_dtype = data.draw(st.sampled_from([dtype, torch.float64]), label="scores dtype")
    all_scores = distinct_values((total,), scores_dtype, seed + 1)
    scores = [
        s.reshape(shape)
        for s, shape in zip(torch.split(all_scores, [math.prod(s) for s in tensor_shapes]), tensor_shapes)
    ]
    remaining = total - sum(earlier)
    amount = data.draw(amounts(remaining), label="amount")
    k = ours_prune._compute_nparams_toprune(amount, remaining)
    if method == "random" and k <= remaining:
        promoted = torch.promote_types(dtype, scores_dtype) if any(scored) else dtype
        torch.manual_seed(seed)
        assume(not ties_at_boundary(-torch.rand(remaining, dtype=promoted), k))

    def build():
        return nn.ModuleList(nn.Module() for _ in tensor_shapes)

    def act(prune, modules):
        for module, value, count in zip(modules, values, earlier):
            module.w = nn.Parameter(value.clone())
            if count:
                prune.l1_unstructured(module, "w", count)
        pairs = [(module, "w") for module in modules]
        importance = {pair: s for pair, s, use in zip(pairs, scores, scored) if use}
        pruning_method = prune.L1Unstructured if method == "l1" else prune.RandomUnstructured
        prune.global_unstructured(pairs, pruning_method, importance_scores=importance, amount=amount)

    results = run_both(build, act, seed)
    (theirs, their_error), (ours, our_error) = results["torch"], results["prunereg"]
    event(f"torch raised {type(their_error).__name__}" if their_error else "both pruned")
    assert_same_error(their_error, our_error)
    if their_error is None:
        for their_module, our_module in zip(theirs, ours):
            assert_same_pruning(their_module, our_module)


# --- bad input: torch's error types -------------------------------------------------------

BAD_INPUTS = {
    "amount not a number": lambda p, m: p.l1_unstructured(m, "weight", "half"),
    "amount a tensor": lambda p, m: p.random_unstructured(m, "weight", torch.tensor(0.5)),
    "float amount above 1": lambda p, m: p.l1_unstructured(m, "weight", 1.5),
    "float amount infinite": lambda p, m: p.l1_unstructured(m, "weight", math.inf),
    "negative float amount": lambda p, m: p.random_structured(m, "weight", -0.1, 0),
    "negative int amount": lambda p, m: p.ln_structured(m, "weight", -1, 2, 0),
    "int amount too large": lambda p, m: p.l1_unstructured(m, "weight", 13),
    "int amount too large, structured": lambda p, m: p.ln_structured(m, "weight", 4, 2, 0),
    "int amount too large on re-prune": lambda p, m: (
        p.l1_unstructured(m, "weight", 10),
        p.l1_unstructured(m, "weight", 3),
    ),
    "structured on 1-D": lambda p, m: p.random_structured(m, "bias", 1, 0),
    "dim too large": lambda p, m: p.ln_structured(m, "weight", 1, 2, 2),
    "dim too negative": lambda p, m: p.random_structured(m, "weight", 1, -3),
    "dim too negative on re-prune": lambda p, m: (p.identity(m, "weight"), p.ln_structured(m, "weight", 1, 2, -3)),
    "unknown norm": lambda p, m: p.ln_structured(m, "weight", 1, "nuc-ish", 0),
    "scores of another shape": lambda p, m: p.l1_unstructured(m, "weight", 1, importance_scores=torch.ones(12)),
    "custom mask of another shape": lambda p, m: p.custom_from_mask(m, "weight", torch.ones(4, 3)),
    "not a parameter": lambda p, m: p.l1_unstructured(m, "buffer", 1),
    "no such tensor": lambda p, m: p.identity(m, "nope"),
    "remove unpruned": lambda p, m: p.remove(m, "weight"),
    "container gets a non-method": lambda p, m: p.PruningContainer().add_pruning_method("l1"),
    "global, parameters not iterable": lambda p, m: p.global_unstructured(m, p.L1Unstructured, amount=1),
    "global, scores not a dict": lambda p, m: p.global_unstructured(
        [(m, "weight")], p.L1Unstructured, importance_scores=[], amount=1
    ),
    "global, structured method": lambda p, m: p.global_unstructured(
        [(m, "weight")], p.LnStructured, amount=1, n=2, dim=0
    ),
    "global, a function": lambda p, m: p.global_unstructured([(m, "weight")], p.l1_unstructured, amount=1),
    "global, no parameters": lambda p, m: p.global_unstructured([], p.L1Unstructured, amount=1),
    "global, amount too large": lambda p, m: p.global_unstructured(
        [(m, "weight"), (m, "bias")], p.L1Unstructured, amount=16
    ),
    "global, scores of another count": lambda p, m: p.global_unstructured(
        [(m, "weight")], p.L1Unstructured, importance_scores={(m, "weight"): torch.ones(5)}, amount=1
    ),
}


def linear_with_buffer() -> nn.Module:
    module = nn.Linear(4, 3)
    module.register_buffer("buffer", torch.ones(3))
    return module


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_raises_torchs_error_type(case):
    results = run_both(linear_with_buffer, BAD_INPUTS[case], seed=0)
    their_error, our_error = results["torch"][1], results["prunereg"][1]
    assert their_error is not None
    assert_same_error(their_error, our_error)
