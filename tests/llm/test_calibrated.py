"""The calibrated-method contract: argument validation and the group checks methods rely on."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from prunereg._oneshot.contract import (
    KIND,
    CalibratedMethod,
    LayerStatistics,
    PrunedWeight,
    check_sparsity,
    parse_pattern,
)


class KeepAll(CalibratedMethod):
    """The smallest concrete method: prunes nothing, needs norms."""

    STATISTICS = frozenset({"input_sq_norms"})

    def prune_group(
        self, weights: Sequence[torch.Tensor], statistics: LayerStatistics, sparsities: Sequence[float]
    ) -> list[PrunedWeight]:
        self.check_group(weights, statistics, sparsities)
        return [PrunedWeight(w.clone(), torch.ones_like(w, dtype=torch.bool)) for w in weights]


def norms(in_features: int) -> LayerStatistics:
    return LayerStatistics(n_tokens=3, input_sq_norms=torch.ones(in_features))


def test_defaults_and_kind() -> None:
    method = KeepAll()
    assert (method.sparsity, method.pattern, method.n_m) == (0.5, None, None)
    assert KeepAll.PRUNING_TYPE == KIND == "calibrated"
    assert KeepAll.UPDATES_WEIGHTS is False
    assert repr(method) == "KeepAll(sparsity=0.5)"


def test_pattern_sets_n_m() -> None:
    method = KeepAll(sparsity=0.25, pattern="1:4")
    assert method.n_m == (1, 4)
    assert repr(method) == "KeepAll(pattern='1:4')"
    assert KeepAll(pattern="2:4").n_m == (2, 4)


@pytest.mark.parametrize("sparsity", [-0.1, 1.0, 1.5, float("nan")])
def test_sparsity_out_of_range(sparsity: float) -> None:
    with pytest.raises(ValueError, match="sparsity must be in"):
        KeepAll(sparsity=sparsity)


@pytest.mark.parametrize("sparsity", ["0.5", None, True])
def test_sparsity_not_a_number(sparsity: object) -> None:
    with pytest.raises(TypeError, match="sparsity must be a number"):
        KeepAll(sparsity=sparsity)  # type: ignore[arg-type]


@pytest.mark.parametrize("pattern", ["2-4", "2:", ":4", "a:b", "2:4:8", "-1:4"])
def test_malformed_pattern(pattern: str) -> None:
    with pytest.raises(ValueError, match="must look like 'N:M'"):
        parse_pattern(pattern)


@pytest.mark.parametrize("pattern", ["0:4", "4:4", "5:4"])
def test_pattern_needs_n_below_m(pattern: str) -> None:
    with pytest.raises(ValueError, match="0 < N < M"):
        KeepAll(sparsity=0.5, pattern=pattern)


def test_pattern_not_a_string() -> None:
    with pytest.raises(TypeError, match="pattern must be a string"):
        KeepAll(pattern=24)  # type: ignore[arg-type]


def test_pattern_must_match_sparsity() -> None:
    with pytest.raises(ValueError, match=r"prunes 0\.25 of the weights"):
        KeepAll(sparsity=0.5, pattern="1:4")


def test_check_sparsity_returns_float() -> None:
    assert check_sparsity(0) == 0.0 and isinstance(check_sparsity(0), float)


def test_unknown_statistic_is_rejected_at_class_creation() -> None:
    with pytest.raises(TypeError, match="unknown statistics: activations"):

        class Bad(KeepAll):
            STATISTICS = frozenset({"activations"})


def test_abstract_prune_group() -> None:
    with pytest.raises(TypeError):
        CalibratedMethod()  # type: ignore[abstract]


def test_statistics_are_frozen() -> None:
    stats = norms(4)
    with pytest.raises(AttributeError):
        stats.n_tokens = 5  # type: ignore[misc]


def test_check_group_accepts_a_well_formed_group() -> None:
    weights = [torch.randn(3, 8), torch.randn(5, 8)]
    out = KeepAll().prune_group(weights, norms(8), [0.5, 0.5])
    assert [tuple(p.weight.shape) for p in out] == [(3, 8), (5, 8)]


@pytest.mark.parametrize(
    ("weights", "stats", "sparsities", "error", "message"),
    [
        ([], norms(8), [], ValueError, "at least one weight"),
        ([torch.randn(3, 8)], norms(8), [0.5, 0.5], ValueError, "1 weights but 2 sparsities"),
        ([torch.randn(3, 8)], norms(8), [1.0], ValueError, "each layer's sparsity"),
        ([torch.randn(3, 8, 1)], norms(8), [0.5], ValueError, r"\[out, in\] matrices"),
        ([torch.randn(3, 8), torch.randn(3, 4)], norms(8), [0.5, 0.5], ValueError, "share in_features"),
        ([torch.randn(3, 8, dtype=torch.float64)], norms(8), [0.5], TypeError, "must be float32"),
        ([torch.randn(3, 8)], LayerStatistics(n_tokens=1), [0.5], ValueError, "needs the statistic 'input_sq_norms'"),
        ([torch.randn(3, 8)], norms(4), [0.5], ValueError, r"has shape \(4,\), expected \(8,\)"),
    ],
)
def test_check_group_rejects(
    weights: list[torch.Tensor], stats: LayerStatistics, sparsities: list[float], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        KeepAll().prune_group(weights, stats, sparsities)


def test_check_group_pattern_needs_divisible_inputs() -> None:
    with pytest.raises(ValueError, match="divisible by 4"):
        KeepAll(pattern="2:4").prune_group([torch.randn(2, 6)], norms(6), [0.5])
