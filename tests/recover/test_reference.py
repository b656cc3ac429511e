"""refit and replace against float64 transcriptions: numpy's lstsq on the tokens, with damping, bias and masks."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

import prunereg
from tests.recover import reference
from tests.support.tiny_lm import calibration_ids, tiny_llama, tiny_mistral

pytest.importorskip("transformers")

RIDGE = 1e-3
BOTH = ("attention", "mlp")


def _float64(model: torch.nn.Module) -> torch.nn.Module:
    return model.double().eval()


def _pair(build=tiny_llama, **overrides):  # type: ignore[no-untyped-def]
    """A float64 model with weights large enough to matter, and its copy as the teacher."""
    model = _float64(build(**overrides) if overrides else build())
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.mul_(8)
    return model, copy.deepcopy(model)


def _assert_same(model: torch.nn.Module, expected: torch.nn.Module) -> None:
    mine, theirs = dict(model.named_parameters()), dict(expected.named_parameters())
    assert mine.keys() == theirs.keys()
    for name, parameter in mine.items():
        torch.testing.assert_close(parameter, theirs[name], rtol=1e-8, atol=1e-10, msg=name)


def _zero_biases(model: torch.nn.Module, *owners: str) -> None:
    """Give every Linear of the named modules of each block a zero bias, as the config flags build them."""
    for block in model.model.layers:
        for owner in owners:
            for layer in getattr(block, owner).children():
                if isinstance(layer, torch.nn.Linear):
                    layer.bias = torch.nn.Parameter(torch.zeros(layer.out_features, dtype=torch.float64))


def _solver(ridge: float, intercept: bool):  # type: ignore[no-untyped-def]
    return lambda x, r, layer: reference.damped_lstsq(x, r, ridge, intercept and layer.bias is not None)


@pytest.mark.parametrize("writers", [("attention", "mlp"), ("mlp",), ("attention",)])
def test_refit_is_the_damped_least_squares_optimum_block_after_block(writers: tuple[str, ...]) -> None:
    model, teacher = _pair(layers=3)
    ids = calibration_ids(8, 12)
    prunereg.shrink(model, "flap", ids, mlp=0.5, heads=0.5)  # FLAP's compensation: mlp_bias and attention_bias
    expected = copy.deepcopy(model)
    report = prunereg.recover(model, teacher, ids, "refit", ridge=RIDGE, writers=writers, progress=False)
    assert report.undone == [] and report.config == {}
    reference.refit(expected, teacher, ids, _solver(RIDGE, intercept=True), writers)
    _assert_same(model, expected)


def test_without_damping_refit_is_plain_least_squares_and_switches_biases_on() -> None:
    model, teacher = _pair(layers=2)
    ids = calibration_ids(8, 12)
    prunereg.shrink(model, "flap", ids, mlp=0.5, compensate=False)  # no bias anywhere
    expected = copy.deepcopy(model)
    report = prunereg.recover(model, teacher, ids, "refit", ridge=0.0, writers=BOTH, progress=False)
    assert report.config == {"attention_bias": [False, True], "mlp_bias": [False, True]}
    assert model.config.mlp_bias and model.config.attention_bias
    _zero_biases(expected, "mlp", "self_attn")  # what mlp_bias / attention_bias build
    reference.refit(expected, teacher, ids, _solver(0.0, intercept=True), ("attention", "mlp"))
    _assert_same(model, expected)
    assert all(bool(block.mlp.down_proj.bias.abs().sum() > 0) for block in model.model.layers)


@pytest.mark.parametrize(
    ("build", "options"),
    [(tiny_mistral, {}), (tiny_llama, {"bias": False})],
    ids=["a config that cannot switch biases on", "bias=False"],
)
def test_without_a_bias_refit_has_no_intercept(build: Any, options: dict[str, Any]) -> None:
    model, teacher = _pair(build)
    ids = calibration_ids(8, 12)
    prunereg.shrink(model, "flap", ids, mlp=0.5, compensate=False)
    expected = copy.deepcopy(model)
    report = prunereg.recover(model, teacher, ids, "refit", ridge=RIDGE, writers=BOTH, progress=False, **options)
    assert report.config == {} and model.model.layers[0].mlp.down_proj.bias is None
    reference.refit(expected, teacher, ids, _solver(RIDGE, intercept=False), ("attention", "mlp"))
    _assert_same(model, expected)


def _few_exact_zeros(model: torch.nn.Module, ids: torch.Tensor) -> None:
    """A zero or two in each row of the blocks' matrices: pruned (over 1 % of each), one short mask per row."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in model.model.layers.parameters():
            if parameter.dim() == 2:
                assert parameter.shape[1] <= 100  # so that one zero a row is over the share that counts as pruned
                for row in range(parameter.shape[0]):
                    count = int(torch.randint(1, 3, (1,), generator=generator))
                    parameter[row, torch.randperm(parameter.shape[1], generator=generator)[:count]] = 0


def _wanda_half(model: torch.nn.Module, ids: torch.Tensor) -> None:
    prunereg.oneshot(model, "wanda", calibration=ids, sparsity=0.5, progress=False)


@pytest.mark.parametrize("prune", [_wanda_half, _few_exact_zeros])
def test_on_a_masked_model_each_row_is_solved_over_its_kept_weights_and_every_zero_stays(prune: Any) -> None:
    model, teacher = _pair(layers=2)
    ids = calibration_ids(8, 12)
    prune(model, ids)
    zeros = {name: p == 0 for name, p in model.named_parameters() if p.dim() == 2}
    expected = copy.deepcopy(model)
    prunereg.recover(model, teacher, ids, "refit", ridge=RIDGE, progress=False)

    def solve(x: np.ndarray, r: np.ndarray, layer: torch.nn.Linear):  # type: ignore[no-untyped-def]
        kept = (layer.weight != 0).numpy()
        return reference.masked_lstsq(x, r, kept, RIDGE, intercept=layer.bias is not None)

    _zero_biases(expected, "mlp", "self_attn")  # refit switched the biases on first
    reference.refit(expected, teacher, ids, solve, ("attention", "mlp"))
    _assert_same(model, expected)
    for name, zero in zeros.items():
        assert bool((model.get_parameter(name)[zero] == 0).all()), name
    assert any(bool((model.get_parameter(name)[~zero] != 0).all()) for name in zeros)


@pytest.mark.parametrize("intercept", [True, False])
def test_replace_folds_the_least_squares_map_into_the_down_projection_before_each_span(intercept: bool) -> None:
    model, teacher = _pair(layers=5)
    ids = calibration_ids(8, 12)
    report = prunereg.shrink(model, "block_influence", ids, layers=2)
    removed = report.removed_blocks
    expected = copy.deepcopy(model)
    recovered = prunereg.recover(model, teacher, ids, "replace", ridge=RIDGE, bias=intercept, progress=False)
    if intercept:
        _zero_biases(expected, "mlp")
    reference.replace(expected, teacher, ids, removed, RIDGE, intercept)
    _assert_same(model, expected)
    kept = [i for i in range(5) if i not in removed]
    assert [step.index for step in recovered.steps if step.changed] == [
        j for j, i in enumerate(kept) if i + 1 in removed
    ]
    assert recovered.undone == []


@pytest.mark.parametrize(
    ("removes", "writers"),
    [({"mlp": 0.5}, ("mlp",)), ({"heads": 0.5}, ("attention",)), ({"mlp": 0.5, "heads": 0.5}, BOTH)],
)
def test_by_default_a_writer_is_refit_only_where_its_part_is_no_longer_the_dense_one(
    removes: dict[str, float], writers: tuple[str, ...]
) -> None:
    model, teacher = _pair(layers=2)
    ids = calibration_ids(8, 12)
    prunereg.shrink(model, "wanda_sp", ids, **removes)
    expected = copy.deepcopy(model)
    report = prunereg.recover(model, teacher, ids, "refit", ridge=RIDGE, progress=False)
    owners = {"attention": "self_attn", "mlp": "mlp"}
    _zero_biases(expected, *(owners[kind] for kind in writers))
    reference.refit(expected, teacher, ids, _solver(RIDGE, intercept=True), writers)
    _assert_same(model, expected)
    for step in report.steps:
        assert ("o_proj" in step.note, "down_proj" in step.note) == ("attention" in writers, "mlp" in writers)
    assert set(report.config) == {f"{kind}_bias" for kind in writers}


def test_by_default_after_removed_blocks_only_the_mlp_of_each_block_before_a_removed_span_is_refit() -> None:
    model, teacher = _pair(layers=5)
    ids = calibration_ids(8, 12)
    removed = prunereg.shrink(model, "block_influence", ids, layers=2).removed_blocks
    untouched = copy.deepcopy(model)
    report = prunereg.recover(model, teacher, ids, "refit", ridge=RIDGE, progress=False)
    kept = [i for i in range(5) if i not in removed]
    before_a_span = [j for j, i in enumerate(kept) if i + 1 in removed]
    assert before_a_span  # the teacher's blocks after it are what its MLP's refit takes on
    for index, step in enumerate(report.steps):
        assert ("down_proj" in step.note) == (index in before_a_span) and "o_proj" not in step.note
        if index not in before_a_span:  # the dense model's block on moved inputs: left as it is
            theirs = dict(untouched.model.layers[index].named_parameters())
            for name, parameter in model.model.layers[index].named_parameters():
                # (the zero biases the config flag builds in every block, once one block's refit uses them)
                assert torch.equal(parameter, theirs[name]) if name in theirs else not parameter.any(), name
    assert set(report.config) == {"mlp_bias"}
