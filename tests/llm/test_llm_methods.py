"""Wanda, SparseGPT and magnitude against slow, direct transcriptions of their papers' equations."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from hypothesis import given, settings
from hypothesis import strategies as st

import prunereg
import prunereg.testing
from prunereg import LayerStatistics
from prunereg.toolkit import lowest_per_row
from prunereg_llm.magnitude import Magnitude
from prunereg_llm.sparsegpt import SparseGPT, obs_sweep, upper_cholesky_of_inverse
from prunereg_llm.wanda import Wanda

# ---------------------------------------------------------------- fixtures


def random_layer(rows: int, columns: int, seed: int, tokens: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight ``[rows, columns]`` and calibration inputs ``[tokens, columns]`` with uneven feature scales."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, columns, generator=gen)
    inputs = torch.randn(tokens, columns, generator=gen) * torch.rand(columns, generator=gen).add_(0.1) * 3
    return weight, inputs


def statistics_of(inputs: torch.Tensor) -> LayerStatistics:
    """Both statistics as the engine defines them (in the inputs' dtype)."""
    return LayerStatistics(
        n_tokens=inputs.shape[0],
        input_sq_norms=inputs.square().sum(0),
        hessian=2 * inputs.T @ inputs / inputs.shape[0],
    )


def ranked(values: Sequence[float], candidates: Sequence[int]) -> list[int]:
    """``candidates`` from lowest value to highest, the lower index first among equals."""
    return sorted(candidates, key=lambda j: (values[j], j))


# ---------------------------------------------------------------- slow references


def pruned_per_row_reference(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Per output row, prune the round(sparsity * in) lowest scores: one explicit sort per row."""
    rows, columns = scores.shape
    pruned = torch.zeros(rows, columns, dtype=torch.bool)
    for r in range(rows):
        for j in ranked(scores[r].tolist(), range(columns))[: round(sparsity * columns)]:
            pruned[r, j] = True
    return pruned


def pruned_n_of_m_reference(scores: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """In every M consecutive inputs of each row, prune the N lowest."""
    rows, columns = scores.shape
    pruned = torch.zeros(rows, columns, dtype=torch.bool)
    for r in range(rows):
        for start in range(0, columns, m):
            for j in ranked(scores[r].tolist(), range(start, start + m))[:n]:
                pruned[r, j] = True
    return pruned


def sparsegpt_reference(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    layer_rows: Sequence[int],
    sparsities: Sequence[float],
    n_m: tuple[int, int] | None,
    blocksize: int,
    dampening: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseGPT column by column in float64, from the paper's equations with explicit inverses.

    Column j is pruned against ``F = columns j..end`` still free: with ``G = inverse(H[F, F])``
    a pruned weight's saliency is ``w^2 / G[0, 0]`` and the OBS update of its row is
    ``W[r, F] -= w / G[0, 0] * G[0, :]``. The mask is chosen from the saliencies at the start
    of each block of columns (unstructured, per layer's rows) or of each M columns (N:M, per row).
    """
    W = weight.to(torch.float64).clone()
    H = hessian.to(torch.float64).clone()
    dead = H.diagonal() == 0
    H.diagonal()[dead] = 1
    W[:, dead] = 0
    H += dampening * H.diagonal().mean() * torch.eye(H.shape[0], dtype=torch.float64)
    rows, columns = W.shape
    inverses = [torch.linalg.inv(H[j:, j:]) for j in range(columns)]
    saliency_scale = torch.tensor([inverses[j][0, 0].item() for j in range(columns)], dtype=torch.float64)
    pruned = torch.zeros(rows, columns, dtype=torch.bool)
    starts = [sum(layer_rows[:i]) for i in range(len(layer_rows))]
    for j in range(columns):
        if n_m is None and j % blocksize == 0:
            block = range(j, min(j + blocksize, columns))
            saliency = W[:, block] ** 2 / saliency_scale[list(block)]
            for start, size, sparsity in zip(starts, layer_rows, sparsities, strict=True):
                entries = [(r, c) for r in range(start, start + size) for c in range(len(block))]
                values = [saliency[r, c].item() for r, c in entries]
                for e in ranked(values, range(len(entries)))[: round(sparsity * len(entries))]:
                    pruned[entries[e][0], block[entries[e][1]]] = True
        if n_m is not None and j % n_m[1] == 0:
            group = list(range(j, j + n_m[1]))
            saliency = W[:, group] ** 2 / saliency_scale[group]
            for r in range(rows):
                for c in ranked(saliency[r].tolist(), range(n_m[1]))[: n_m[0]]:
                    pruned[r, group[c]] = True
        G = inverses[j]
        for r in range(rows):
            if pruned[r, j]:
                W[r, j:] -= W[r, j] / G[0, 0] * G[0, :]
                W[r, j] = 0
    pruned[:, dead] = True
    return W, ~pruned


# ---------------------------------------------------------------- registration


@pytest.mark.parametrize(("name", "cls"), [("wanda", Wanda), ("sparsegpt", SparseGPT), ("magnitude", Magnitude)])
def test_registered_by_name_as_calibrated(name: str, cls: type) -> None:
    assert prunereg.get(name) is cls
    assert cls.PRUNING_TYPE == "calibrated"


@pytest.mark.parametrize(
    ("name", "options"),
    [("wanda", {}), ("sparsegpt", {}), ("sparsegpt", {"blocksize": 4}), ("magnitude", {"scope": "matrix"})],
)
def test_passes_the_conformance_kit(name: str, options: dict[str, object]) -> None:
    prunereg.testing.check_calibrated_method(name, **options)


def test_statistics_each_method_asks_for() -> None:
    assert {"input_sq_norms"} == Wanda.STATISTICS and not Wanda.UPDATES_WEIGHTS
    assert {"hessian"} == SparseGPT.STATISTICS and SparseGPT.UPDATES_WEIGHTS
    assert frozenset() == Magnitude.STATISTICS and not Magnitude.UPDATES_WEIGHTS


# ---------------------------------------------------------------- Wanda


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 6),
    columns=st.integers(1, 24),
    sparsity=st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.7, 0.95]),
    seed=st.integers(0, 2**16),
)
def test_wanda_per_row_matches_explicit_sort(rows: int, columns: int, sparsity: float, seed: int) -> None:
    weight, inputs = random_layer(rows, columns, seed)
    stats = statistics_of(inputs)
    (result,) = Wanda(sparsity).prune_group([weight], stats, [sparsity])
    assert stats.input_sq_norms is not None
    expected = pruned_per_row_reference(weight.abs() * stats.input_sq_norms.sqrt(), sparsity)
    assert torch.equal(result.mask, ~expected)
    assert torch.equal(result.weight, weight * result.mask)


def test_per_row_selection_prunes_nan_first_and_still_prunes_k_per_row() -> None:
    scores = torch.tensor([[float("nan"), 1.0, float("nan"), 0.5], [float("nan")] * 4, [3.0, float("nan"), 2.0, 1.0]])
    for sparsity in (0.25, 0.5, 0.75, 1.0):
        pruned = lowest_per_row(scores, sparsity)
        assert torch.equal(pruned, pruned_per_row_reference(scores.nan_to_num(nan=-1.0), sparsity))
        assert pruned.sum(dim=1).tolist() == [round(4 * sparsity)] * 3


@settings(max_examples=50, deadline=None)
@given(
    rows=st.integers(1, 6),
    columns=st.integers(1, 24),
    sparsity=st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.7, 0.95]),
    levels=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_per_row_selection_breaks_ties_by_position(
    rows: int, columns: int, sparsity: float, levels: int, seed: int
) -> None:
    scores = torch.randint(0, levels, (rows, columns), generator=torch.Generator().manual_seed(seed)).float()
    assert torch.equal(lowest_per_row(scores, sparsity), pruned_per_row_reference(scores, sparsity))


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 5),
    groups=st.integers(1, 5),
    n_m=st.sampled_from([(1, 2), (2, 4), (4, 8)]),
    seed=st.integers(0, 2**16),
)
def test_wanda_n_m_matches_explicit_groups(rows: int, groups: int, n_m: tuple[int, int], seed: int) -> None:
    n, m = n_m
    weight, inputs = random_layer(rows, groups * m, seed)
    stats = statistics_of(inputs)
    (result,) = Wanda(n / m, pattern=f"{n}:{m}").prune_group([weight], stats, [0.9])  # the pattern wins
    assert stats.input_sq_norms is not None
    expected = pruned_n_of_m_reference(weight.abs() * stats.input_sq_norms.sqrt(), n, m)
    assert torch.equal(result.mask, ~expected)
    assert torch.equal((~result.mask).reshape(rows, groups, m).sum(-1), torch.full((rows, groups), n))


def test_wanda_ranks_by_input_norm_not_magnitude_alone() -> None:
    weight = torch.tensor([[1.0, 2.0]])
    stats = LayerStatistics(n_tokens=1, input_sq_norms=torch.tensor([100.0, 1.0]))
    (result,) = Wanda(0.5).prune_group([weight], stats, [0.5])
    assert result.mask.tolist() == [[True, False]]  # 1 * 10 beats 2 * 1


def test_wanda_group_prunes_each_layer_on_its_own() -> None:
    q, inputs = random_layer(8, 16, seed=1)
    k, _ = random_layer(4, 16, seed=2)
    stats = statistics_of(inputs)
    together = Wanda(0.5).prune_group([q, k], stats, [0.25, 0.75])
    alone = [Wanda(0.5).prune_group([w], stats, [s])[0] for w, s in ((q, 0.25), (k, 0.75))]
    for a, b in zip(together, alone, strict=True):
        assert torch.equal(a.mask, b.mask) and torch.equal(a.weight, b.weight)
    assert (~together[1].mask).sum() == 3 * 4 * 4


# ---------------------------------------------------------------- magnitude


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 6),
    columns=st.integers(1, 24),
    sparsity=st.sampled_from([0.0, 0.2, 0.5, 0.8]),
    seed=st.integers(0, 2**16),
)
def test_magnitude_per_row_matches_explicit_sort(rows: int, columns: int, sparsity: float, seed: int) -> None:
    weight, _ = random_layer(rows, columns, seed)
    (result,) = Magnitude(sparsity).prune_group([weight], LayerStatistics(n_tokens=0), [sparsity])
    assert torch.equal(result.mask, ~pruned_per_row_reference(weight.abs(), sparsity))


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), columns=st.integers(1, 300), sparsity=st.floats(0, 0.99), seed=st.integers(0, 2**16))
def test_magnitude_per_matrix_is_torch_l1_unstructured(rows: int, columns: int, sparsity: float, seed: int) -> None:
    weight, _ = random_layer(rows, columns, seed)
    (result,) = Magnitude(sparsity, scope="matrix").prune_group([weight], LayerStatistics(n_tokens=0), [sparsity])
    layer = torch.nn.Linear(columns, rows, bias=False)
    layer.weight.data.copy_(weight)
    torch_prune.l1_unstructured(layer, "weight", amount=sparsity)
    assert torch.equal(result.mask, layer.get_buffer("weight_mask").bool())


def test_magnitude_n_m() -> None:
    weight, _ = random_layer(3, 16, seed=5)
    (result,) = Magnitude(pattern="2:4").prune_group([weight], LayerStatistics(n_tokens=0), [0.5])
    assert torch.equal(result.mask, ~pruned_n_of_m_reference(weight.abs(), 2, 4))


def test_magnitude_scope_is_checked() -> None:
    with pytest.raises(ValueError, match="scope must be one of 'row', 'matrix'"):
        Magnitude(scope="column")


# ---------------------------------------------------------------- SparseGPT


@settings(max_examples=20, deadline=None)
@given(
    layer_rows=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    columns=st.integers(1, 20),
    blocksize=st.integers(1, 8),
    sparsity=st.sampled_from([0.0, 0.3, 0.5, 0.8]),
    seed=st.integers(0, 2**16),
)
def test_sparsegpt_sweep_matches_column_by_column_obs(
    layer_rows: list[int], columns: int, blocksize: int, sparsity: float, seed: int
) -> None:
    weight, inputs = random_layer(sum(layer_rows), columns, seed)
    hessian = statistics_of(inputs.double()).hessian
    assert hessian is not None
    sparsities = [sparsity] * len(layer_rows)
    expected = sparsegpt_reference(weight, hessian, layer_rows, sparsities, None, blocksize, 0.01)
    got = obs_sweep(
        weight.double(), hessian.double(), layer_rows, sparsities, n_m=None, blocksize=blocksize, dampening=0.01
    )
    assert torch.equal(got[1], expected[1])
    torch.testing.assert_close(got[0], expected[0], rtol=1e-9, atol=1e-9)


@settings(max_examples=20, deadline=None)
@given(
    rows=st.integers(1, 6),
    groups=st.integers(1, 5),
    n_m=st.sampled_from([(1, 2), (2, 4), (3, 4)]),
    blocks_of_m=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_sparsegpt_n_m_sweep_matches_column_by_column_obs(
    rows: int, groups: int, n_m: tuple[int, int], blocks_of_m: int, seed: int
) -> None:
    n, m = n_m
    weight, inputs = random_layer(rows, groups * m, seed)
    hessian = statistics_of(inputs.double()).hessian
    assert hessian is not None
    blocksize = blocks_of_m * m
    expected = sparsegpt_reference(weight, hessian, [rows], [0.5], n_m, blocksize, 0.01)
    got = obs_sweep(weight.double(), hessian.double(), [rows], [0.5], n_m=n_m, blocksize=blocksize, dampening=0.01)
    assert torch.equal(got[1], expected[1])
    torch.testing.assert_close(got[0], expected[0], rtol=1e-9, atol=1e-9)
    assert torch.equal((~got[1]).reshape(rows, groups, m).sum(-1), torch.full((rows, groups), n))


def test_sparsegpt_float32_method_agrees_with_float64_reference() -> None:
    weight, inputs = random_layer(12, 48, seed=11, tokens=256)
    stats = statistics_of(inputs)
    assert stats.hessian is not None
    for pattern, n_m in ((None, None), ("2:4", (2, 4))):
        (result,) = SparseGPT(0.5, pattern=pattern, blocksize=16).prune_group([weight], stats, [0.5])
        expected = sparsegpt_reference(weight, stats.hessian, [12], [0.5], n_m, 16, 0.01)
        assert torch.equal(result.mask, expected[1])
        torch.testing.assert_close(result.weight, expected[0].float(), rtol=1e-4, atol=1e-4)
        assert result.weight.dtype == torch.float32
        assert torch.all(result.weight[~result.mask] == 0)


def test_sparsegpt_stacked_group_equals_each_layer_alone() -> None:
    _, inputs = random_layer(1, 32, seed=4, tokens=128)
    hessian = statistics_of(inputs.double()).hessian
    assert hessian is not None
    layers = [random_layer(rows, 32, seed=rows)[0].double() for rows in (6, 3, 3)]
    sparsities = [0.5, 0.25, 0.75]
    stacked, keep = obs_sweep(torch.cat(layers), hessian, [6, 3, 3], sparsities, n_m=None, blocksize=8, dampening=0.01)
    for (w, m), layer, s in zip(
        zip(stacked.split([6, 3, 3]), keep.split([6, 3, 3]), strict=True), layers, sparsities, strict=True
    ):
        alone_w, alone_m = obs_sweep(
            layer.clone(), hessian, [layer.shape[0]], [s], n_m=None, blocksize=8, dampening=0.01
        )
        assert torch.equal(m, alone_m)
        torch.testing.assert_close(w, alone_w, rtol=1e-12, atol=1e-12)
        assert (~m).sum() == round(s * m.numel())


def test_sparsegpt_update_lowers_the_output_error_of_its_mask() -> None:
    weight, factors = random_layer(16, 64, seed=7, tokens=512)
    inputs = factors[:, :16] @ factors[:16]  # correlated features: what the OBS update exploits
    stats = statistics_of(inputs)
    (result,) = SparseGPT(0.5).prune_group([weight], stats, [0.5])
    updated_error = (inputs @ (result.weight - weight).T).square().sum()
    masked_only_error = (inputs @ (weight * result.mask - weight).T).square().sum()
    assert updated_error < 0.8 * masked_only_error


def test_sparsegpt_dead_inputs_are_pruned_and_the_rest_still_solved() -> None:
    weight, inputs = random_layer(4, 8, seed=9)
    inputs[:, 3] = 0
    stats = statistics_of(inputs)
    (result,) = SparseGPT(0.25).prune_group([weight], stats, [0.25])
    assert not result.mask[:, 3].any() and torch.all(result.weight[:, 3] == 0)
    assert torch.isfinite(result.weight).all()


def test_sparsegpt_leaves_its_inputs_untouched() -> None:
    weight, inputs = random_layer(4, 8, seed=10)
    stats = statistics_of(inputs)
    assert stats.hessian is not None
    weight_before, hessian_before = weight.clone(), stats.hessian.clone()
    SparseGPT(0.5).prune_group([weight], stats, [0.5])
    assert torch.equal(weight, weight_before) and torch.equal(stats.hessian, hessian_before)


def test_upper_cholesky_of_inverse() -> None:
    _, inputs = random_layer(1, 12, seed=12)
    hessian = statistics_of(inputs.double()).hessian
    assert hessian is not None
    factor = upper_cholesky_of_inverse(hessian)
    assert torch.equal(factor, factor.triu())
    torch.testing.assert_close(factor.T @ factor, torch.linalg.inv(hessian))


def test_sparsegpt_rejects_a_hessian_that_is_not_positive_definite() -> None:
    stats = LayerStatistics(n_tokens=1, hessian=-torch.eye(4))
    with pytest.raises(torch.linalg.LinAlgError, match="raise `dampening`"):
        SparseGPT(0.5).prune_group([torch.ones(2, 4)], stats, [0.5])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"blocksize": 0}, "blocksize must be a positive int"),
        ({"blocksize": 2.0}, "blocksize must be a positive int"),
        ({"blocksize": 6, "pattern": "2:4"}, "multiple of the pattern's M=4"),
        ({"dampening": 0.0}, "dampening must be positive"),
    ],
)
def test_sparsegpt_options_are_checked(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SparseGPT(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", [Wanda(), SparseGPT(), Magnitude()])
def test_methods_check_their_group(method: prunereg.CalibratedMethod) -> None:
    with pytest.raises(ValueError, match="1 weights but 2 sparsities"):
        method.prune_group([torch.ones(2, 4)], LayerStatistics(n_tokens=1), [0.5, 0.5])
