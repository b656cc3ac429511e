"""Statistics a plugin registers with the public API alone: gathered by the engines for the methods that ask for them.

The covariance of a block's input hidden states is what SliceGPT's rotation
diagonalises; here a shrink method scores blocks by its trace, and the matrices
it is handed are compared with those of the dense model's own forward. A
calibrated method reads the mean absolute input of each group of layers, in
one-shot and in gradual pruning. Everything here imports only ``prunereg``,
``prunereg.toolkit`` and ``prunereg.testing``, as a plugin would.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import ClassVar

import pytest
import torch
from torch import nn

import prunereg
from prunereg import toolkit
from prunereg.testing import check_calibrated_method, check_shrink_method

pytest.importorskip("transformers")

from tests.support.tiny_lm import calibration_ids, tiny_llama


@toolkit.register_statistic
class BlockInputCovariance(toolkit.Statistic):
    """The covariance of a block's input hidden states over the calibration tokens, float64."""

    NAME = "test_block_input_covariance"
    SITE = "block"

    def __init__(self) -> None:
        self.n_tokens = 0
        self.sums: torch.Tensor | None = None
        self.products: torch.Tensor | None = None

    def fold(self, observation: toolkit.Observation) -> None:
        assert observation.inputs is not None
        x = observation.inputs.reshape(-1, observation.inputs.shape[-1]).double()
        self._add(x.shape[0], x.sum(0), x.T @ x)

    def combine(self, other: toolkit.Statistic) -> None:
        assert isinstance(other, BlockInputCovariance)
        if other.sums is not None and other.products is not None:
            self._add(other.n_tokens, other.sums, other.products)

    def _add(self, n_tokens: int, sums: torch.Tensor, products: torch.Tensor) -> None:
        self.n_tokens += n_tokens
        self.sums = sums.clone() if self.sums is None else self.sums + sums
        self.products = products.clone() if self.products is None else self.products + products

    def result(self) -> torch.Tensor | None:
        if self.sums is None or self.products is None:
            return None
        mean = self.sums / self.n_tokens
        return self.products / self.n_tokens - torch.outer(mean, mean)


@toolkit.register_statistic
class InputAbsSum(toolkit.Statistic):
    """Per input feature of a group of layers: the sum over tokens of ``|x_j|``, float64."""

    NAME = "test_input_abs_sum"
    SITE = "layer_input"

    def __init__(self) -> None:
        self.sums: torch.Tensor | None = None

    def fold(self, observation: toolkit.Observation) -> None:
        sums = observation.rows().double().abs().sum(0)
        self.sums = sums if self.sums is None else self.sums + sums

    def combine(self, other: toolkit.Statistic) -> None:
        assert isinstance(other, InputAbsSum)
        if other.sums is not None:
            self.sums = other.sums.clone() if self.sums is None else self.sums + other.sums

    def result(self) -> torch.Tensor | None:
        return self.sums


class CovarianceTrace(prunereg.ShrinkMethod):
    """Scores a block by the trace of its input covariance, and keeps what it was handed."""

    TARGETS = frozenset({"blocks"})
    STATISTICS = frozenset({"test_block_input_covariance"})

    def __init__(self) -> None:
        self.seen: list[tuple[int, torch.Tensor]] = []

    def block_score(self, statistics: prunereg.BlockStatistics) -> float:
        covariance = statistics["test_block_input_covariance"]
        self.seen.append((statistics.n_tokens, covariance))
        return float(covariance.trace())


class AbsScore(prunereg.CalibratedMethod):
    """Per row, prunes the lowest ``|W_ij| * sum |x_j|``, and keeps the statistics it was handed."""

    STATISTICS = frozenset({"test_input_abs_sum"})

    def __init__(self, sparsity: float = 0.5, pattern: str | None = None) -> None:
        super().__init__(sparsity, pattern)
        self.seen: list[prunereg.LayerStatistics] = []

    def prune_group(
        self, weights: Sequence[torch.Tensor], statistics: prunereg.LayerStatistics, sparsities: Sequence[float]
    ) -> list[prunereg.PrunedWeight]:
        self.check_group(weights, statistics, sparsities)
        self.seen.append(statistics)
        sums = statistics["test_input_abs_sum"].to(weights[0].device, torch.float32)
        results = []
        for weight, sparsity in zip(weights, sparsities, strict=True):
            scores = weight.abs() * sums
            pruned = (
                toolkit.lowest_per_row(scores, sparsity)
                if self.n_m is None
                else toolkit.lowest_n_of_m(scores, *self.n_m)
            )
            results.append(prunereg.PrunedWeight(weight.masked_fill(pruned, 0), pruned.logical_not_()))
        return results


def _block_inputs(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The input hidden states of every decoder block of ``model`` on ``ids``, from its own forward."""
    with torch.no_grad():
        return model(ids, output_hidden_states=True, use_cache=False).hidden_states[:-1]


def test_a_shrink_method_gets_the_block_statistic_a_plugin_registered_and_removes_by_it():
    model = tiny_llama(layers=3)
    dense = copy.deepcopy(model)
    ids = calibration_ids(6, 16)
    method = CovarianceTrace()
    report = prunereg.shrink(model, method, ids, layers=1, batch_size=2, progress=False)
    assert [n for n, _ in method.seen] == [6 * 16] * 3
    traces = []
    for (_, covariance), hidden in zip(method.seen, _block_inputs(dense, ids), strict=True):
        x = hidden.reshape(-1, hidden.shape[-1]).double()
        expected = torch.cov(x.T, correction=0)
        torch.testing.assert_close(covariance, expected, rtol=1e-9, atol=1e-12)
        traces.append(float(expected.trace()))
    assert report.removed_blocks == [traces.index(min(traces))]


def test_a_calibrated_method_gets_the_layer_statistic_a_plugin_registered_in_oneshot():
    model = tiny_llama(layers=2)
    dense = copy.deepcopy(model)
    ids = calibration_ids(4, 8)
    seen: dict[str, torch.Tensor] = {}
    layers = dict(dense.model.layers[0].named_modules())
    handles = [
        layers[name].register_forward_pre_hook(lambda _, args, name=name: seen.setdefault(name, args[0]))
        for name in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")
    ]
    with torch.no_grad():
        dense(ids, use_cache=False)
    for handle in handles:
        handle.remove()
    method = AbsScore(0.5)
    report = prunereg.oneshot(model, method, calibration=ids, batch_size=4, progress=False)
    assert len(method.seen) == 8 and all(statistics.n_tokens == 32 for statistics in method.seen)
    for statistics, name in zip(method.seen[:4], seen, strict=True):  # block 0 reads what the dense model reads
        expected = seen[name].reshape(-1, seen[name].shape[-1]).double().abs().sum(0)
        torch.testing.assert_close(statistics["test_input_abs_sum"], expected, rtol=1e-12, atol=1e-12)
        assert statistics.input_sq_norms is None and statistics.hessian is None
    assert all(layer.sparsity == pytest.approx(0.5) for layer in report.layers)


class HandedAbsScore(AbsScore):
    """:class:`AbsScore` keeping the statistics handed to any of its instances (gradual pruning makes one a step)."""

    HANDED: ClassVar[list[prunereg.LayerStatistics]] = []

    def prune_group(
        self, weights: Sequence[torch.Tensor], statistics: prunereg.LayerStatistics, sparsities: Sequence[float]
    ) -> list[prunereg.PrunedWeight]:
        self.HANDED.append(statistics)
        return super().prune_group(weights, statistics, sparsities)


def test_a_calibrated_method_gets_the_layer_statistic_a_plugin_registered_in_gradual_pruning():
    model = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 4))
    batches = [torch.randn(5, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    inputs: dict[int, list[torch.Tensor]] = {0: [], 2: []}
    hooks = [model[i].register_forward_pre_hook(lambda _, args, i=i: inputs[i].append(args[0])) for i in inputs]
    with torch.no_grad():
        for batch in batches:
            model(batch)
    for hook in hooks:
        hook.remove()
    HandedAbsScore.HANDED.clear()
    schedule = prunereg.schedule("linear", initial=0.25, final=0.5, start=0, end=2, every=2)
    prunereg.GradualPruning(model, HandedAbsScore, schedule, calibration=batches)
    assert len(HandedAbsScore.HANDED) == 2
    for statistics, index in zip(HandedAbsScore.HANDED, inputs, strict=True):
        expected = torch.cat(inputs[index]).double().abs().sum(0)
        assert statistics.n_tokens == 15
        torch.testing.assert_close(statistics["test_input_abs_sum"], expected, rtol=1e-12, atol=1e-12)


def test_the_conformance_kits_gather_a_plugin_statistic_for_the_method_that_asks():
    check_calibrated_method(AbsScore, devices=["cpu"])
    check_shrink_method(CovarianceTrace, devices=["cpu"])


def test_a_statistic_is_read_by_name_and_one_not_gathered_is_a_clear_key_error():
    statistics = prunereg.LayerStatistics(3, extra={"test_input_abs_sum": torch.ones(2)})
    assert statistics["test_input_abs_sum"].tolist() == [1.0, 1.0]
    with pytest.raises(KeyError, match="no statistic 'hessian' was gathered here"):
        statistics["hessian"]


def test_the_registered_names_include_the_built_in_statistics_and_the_plugins():
    names = toolkit.statistic_names()
    assert {"input_sq_norms", "hessian", "channel_moments", "block_cosine", "expert_routing"} <= names
    assert {"test_block_input_covariance", "test_input_abs_sum"} <= names


@pytest.mark.parametrize(
    "built_in",
    [toolkit.InputSqNorms, toolkit.Hessian, toolkit.ChannelMoments, toolkit.BlockCosine, toolkit.ExpertRouting],
)
def test_the_built_in_statistics_are_public_classes_registered_under_their_names(built_in: type[toolkit.Statistic]):
    assert issubclass(built_in, toolkit.Statistic) and built_in.NAME in toolkit.statistic_names()
    assert toolkit.register_statistic(built_in) is built_in  # the very class the registry holds under its NAME

    class Again(built_in):  # type: ignore[valid-type,misc]
        pass

    with pytest.raises(ValueError, match=rf"'{built_in.NAME}' is taken by prunereg\..*{built_in.__name__}"):
        toolkit.register_statistic(Again)


def test_a_name_another_statistic_holds_is_refused_naming_both_and_the_same_class_again_is_accepted():
    assert toolkit.register_statistic(InputAbsSum) is InputAbsSum

    class Other(InputAbsSum):
        pass

    with pytest.raises(ValueError, match=r"'test_input_abs_sum' is taken by .*InputAbsSum; give .*Other another NAME"):
        toolkit.register_statistic(Other)


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"NAME": "not an identifier", "SITE": "block"}, "NAME must be a Python identifier"),
        ({"NAME": "test_nowhere", "SITE": "everywhere"}, "SITE must be one of 'layer_input', 'block', 'module_call'"),
    ],
)
def test_a_statistic_without_a_proper_name_or_site_is_refused(attributes: dict[str, str], message: str):
    cls = type("Bad", (InputAbsSum,), attributes)
    with pytest.raises(TypeError, match=message):
        toolkit.register_statistic(cls)
    with pytest.raises(TypeError, match=r"subclasses prunereg\.toolkit\.Statistic"):
        toolkit.register_statistic(dict)  # type: ignore[type-var]


def test_a_method_naming_an_unregistered_or_misplaced_statistic_is_refused_when_defined():
    with pytest.raises(TypeError, match=r"unknown statistics: test_never_registered .*register_statistic"):

        class Unknown(AbsScore):
            STATISTICS = frozenset({"test_never_registered"})

    with pytest.raises(TypeError, match=r"names test_block_input_covariance, observed at block; .* layer_input"):

        class OneShotWithABlockStatistic(AbsScore):
            STATISTICS = frozenset({"test_block_input_covariance"})


def test_a_statistic_that_exits_is_an_error_not_the_end_of_the_program():
    class Exits(InputAbsSum):
        def fold(self, observation: toolkit.Observation) -> None:
            raise SystemExit(3)

    with pytest.raises(prunereg.PluginCodeError, match=r"Exits\.fold called sys\.exit\(3\)"):
        Exits().fold(toolkit.Observation(0, torch.ones(1, 2)))
