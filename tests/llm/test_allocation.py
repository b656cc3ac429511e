"""OWL allocation: outlier ratios of a block and the per-block sparsities they give."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunereg._oneshot.allocation import OWL_LAMBDA, OWL_THRESHOLD, outlier_ratio, owl_sparsities
from prunereg._oneshot.contract import LayerStatistics


def stats(sq_norms: list[float]) -> LayerStatistics:
    return LayerStatistics(n_tokens=4, input_sq_norms=torch.tensor(sq_norms))


def test_paper_defaults() -> None:
    assert (OWL_THRESHOLD, OWL_LAMBDA) == (5.0, 0.08)


def test_outlier_ratio_counts_scores_above_threshold_times_mean() -> None:
    # Scores |W| * sqrt(norms): layer one [[1, 1], [1, 20]] * [1, 1]; layer two [[1, 1]] * [1, 2] -> [1, 2].
    weights = [torch.tensor([[1.0, -1.0], [1.0, 20.0]]), torch.tensor([[1.0, 1.0]])]
    statistics = [stats([1.0, 1.0]), stats([1.0, 4.0])]
    # Mean over all six scores is 26 / 6; 20 > 2 * 26/6 but 2 is not, so one of six is an outlier.
    assert outlier_ratio(weights, statistics, threshold=2.0) == pytest.approx(1 / 6)
    assert outlier_ratio(weights, statistics, threshold=5.0) == 0.0


def test_outlier_ratio_matches_an_explicit_count() -> None:
    gen = torch.Generator().manual_seed(3)
    weights = [torch.randn(6, 8, generator=gen) ** 3, torch.randn(4, 8, generator=gen)]
    statistics = [stats(torch.rand(8, generator=gen).tolist()), stats(torch.rand(8, generator=gen).tolist())]
    scores = [
        abs(w[i, j].item()) * s.input_sq_norms[j].item() ** 0.5  # type: ignore[index]
        for w, s in zip(weights, statistics)
        for i in range(w.shape[0])
        for j in range(w.shape[1])
    ]
    mean = sum(scores) / len(scores)
    expected = sum(score > 3 * mean for score in scores) / len(scores)
    assert expected > 0
    assert outlier_ratio(weights, statistics, threshold=3.0) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("weights", "statistics", "threshold", "message"),
    [
        ([torch.ones(2, 2)], [], 5.0, "1 weights but 0 statistics"),
        ([], [], 5.0, "at least one layer"),
        ([torch.ones(2, 2)], [LayerStatistics(n_tokens=1)], 5.0, "needs each layer's input_sq_norms"),
        ([torch.ones(2, 2)], [LayerStatistics(n_tokens=1, input_sq_norms=torch.ones(2))], 0.0, "must be positive"),
    ],
)
def test_outlier_ratio_rejects(
    weights: list[torch.Tensor], statistics: list[LayerStatistics], threshold: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        outlier_ratio(weights, statistics, threshold)


def test_owl_sparsities_worked_example() -> None:
    # Ratios 0, 1, 2 rescale to 0, 0.08, 0.16 (lam 0.08); mean 0.08; the most outliers get the least sparsity.
    assert owl_sparsities([0.0, 0.01, 0.02], target=0.7) == pytest.approx([0.78, 0.7, 0.62])


def test_owl_sparsities_equal_ratios_give_the_target() -> None:
    assert owl_sparsities([0.3, 0.3], target=0.5) == [0.5, 0.5]


@settings(max_examples=50, deadline=None)
@given(
    ratios=st.lists(st.floats(0, 1, allow_nan=False), min_size=2, max_size=30),
    target=st.floats(0.2, 0.8),
    lam=st.floats(0.0, 0.1),
)
def test_owl_sparsities_properties(ratios: list[float], target: float, lam: float) -> None:
    sparsities = owl_sparsities(ratios, target, lam)
    assert sum(sparsities) / len(sparsities) == pytest.approx(target, abs=1e-9)
    assert max(sparsities) - min(sparsities) <= 2 * lam + 1e-9
    order = sorted(range(len(ratios)), key=ratios.__getitem__)
    assert [sparsities[i] for i in order] == sorted(sparsities, reverse=True)


@pytest.mark.parametrize(
    ("ratios", "target", "lam", "error", "message"),
    [
        ([], 0.5, 0.08, ValueError, "at least one block"),
        ([0.1, 0.2], 1.0, 0.08, ValueError, r"must be in \[0, 1\)"),
        ([0.1, 0.2], "0.5", 0.08, TypeError, "must be a number"),
        ([0.1, 0.2], 0.5, 0.6, ValueError, r"lam must be in \[0, 0.5\)"),
        ([0.1, 0.2], 0.05, 0.08, ValueError, "outside"),
    ],
)
def test_owl_sparsities_rejects(ratios: list[float], target: object, lam: float, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        owl_sparsities(ratios, target, lam)  # type: ignore[arg-type]
