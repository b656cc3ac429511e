"""One NaN rule on every selection path: NaN ranks below every number, -inf included, so it is pruned first.

The paths: the core's ``select_k``, ``prune_lowest``, ``top_indices`` and
``L1Unstructured`` (``topk`` below the cutoff, the radix select above it), the
toolkit's row-wise helpers, and the calibrated methods built on them (magnitude
in every scope, SparseGPT unstructured and N:M).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import prunereg.prune as prune
from prunereg import LayerStatistics, toolkit
from prunereg._selection.select import TOPK_CUTOFF
from prunereg_llm.magnitude import Magnitude
from prunereg_llm.sparsegpt import SparseGPT

NAN = float("nan")
M = 4  # the N:M groups' size

# A path: (scores [rows, cols] float32, fraction) -> (pruned bool mask, the scores it ranks, scope id of each entry).
Path = Callable[[torch.Tensor, float], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def whole(scores: torch.Tensor) -> torch.Tensor:
    return torch.zeros(scores.shape, dtype=torch.long)


def per_row(scores: torch.Tensor) -> torch.Tensor:
    return torch.arange(scores.shape[0]).unsqueeze(1).expand(scores.shape)


def per_group(scores: torch.Tensor) -> torch.Tensor:
    cols = scores.shape[1]
    return per_row(scores) * cols + torch.arange(cols).div(M, rounding_mode="floor").expand(scores.shape)


def first_group_only(scores: torch.Tensor) -> torch.Tensor:
    """Scope ids where only each row's first M entries are checked (-1: not checked)."""
    ids = per_row(scores).clone()
    ids[:, M:] = -1
    return ids


def k_of(scores: torch.Tensor, fraction: float) -> int:
    return round(fraction * scores.numel())


def ones_stats(cols: int) -> LayerStatistics:
    """Statistics whose Hessian is the identity: SparseGPT's saliency then ranks as ``|w|``."""
    return LayerStatistics(n_tokens=1, input_sq_norms=torch.ones(cols), hessian=torch.eye(cols))


PATHS: dict[str, Path] = {
    "select_k": lambda s, f: (toolkit.select_k([s], k_of(s, f))[0], s, whole(s)),
    "prune_lowest": lambda s, f: (toolkit.prune_lowest(s, k_of(s, f), torch.ones_like(s)) == 0, s, whole(s)),
    "top_indices": lambda s, f: (
        torch.zeros(s.numel(), dtype=torch.bool).index_fill_(0, toolkit.top_indices(s, k_of(s, f)), True).view(s.shape),
        s,
        whole(s),
    ),
    "l1_unstructured": lambda s, f: (
        prune.L1Unstructured(f).compute_mask(s, torch.ones_like(s)) == 0,
        s.abs(),
        whole(s),
    ),
    "keep_highest_per_row": lambda s, f: (
        ~toolkit.keep_highest_per_row(
            s, torch.ones_like(s, dtype=torch.bool), s.shape[1] - toolkit.count_for(f, s.shape[1])
        ),
        s,
        per_row(s),
    ),
    "lowest_per_row": lambda s, f: (toolkit.lowest_per_row(s, f), s, per_row(s)),
    "lowest_overall": lambda s, f: (toolkit.lowest_overall(s, f), s, whole(s)),
    "lowest_n_of_m": lambda s, f: (toolkit.lowest_n_of_m(s, 2, M), s, per_group(s)),
    "magnitude_row": lambda s, f: (
        ~Magnitude(f, scope="row").prune_group([s], ones_stats(s.shape[1]), [f])[0].mask,
        s.abs(),
        per_row(s),
    ),
    "magnitude_matrix": lambda s, f: (
        ~Magnitude(f, scope="matrix").prune_group([s], ones_stats(s.shape[1]), [f])[0].mask,
        s.abs(),
        whole(s),
    ),
    "magnitude_2_4": lambda s, f: (
        ~Magnitude(0.5, pattern="2:4").prune_group([s], ones_stats(s.shape[1]), [0.5])[0].mask,
        s.abs(),
        per_group(s),
    ),
    # One block: the whole mask is chosen from the first saliency, before any update spreads NaN.
    "sparsegpt_unstructured": lambda s, f: (
        ~SparseGPT(f, blocksize=s.shape[1]).prune_group([s.clone()], ones_stats(s.shape[1]), [f])[0].mask,
        s.abs(),
        whole(s),
    ),
    # Each row's first group is chosen before any update (later ones from updated weights).
    "sparsegpt_2_4": lambda s, f: (
        ~SparseGPT(0.5, pattern="2:4", blocksize=s.shape[1])
        .prune_group([s.clone()], ones_stats(s.shape[1]), [0.5])[0]
        .mask,
        s.abs(),
        first_group_only(s),
    ),
}
SMALL_ONLY = {"sparsegpt_unstructured", "sparsegpt_2_4", "magnitude_row", "magnitude_matrix", "magnitude_2_4"}


def rank(value: float) -> tuple[int, float]:
    """The documented order: every NaN below every number, -inf included."""
    return (0, 0.0) if math.isnan(value) else (1, value)


def assert_nan_first(pruned: torch.Tensor, ranked: torch.Tensor, scopes: torch.Tensor) -> None:
    """In every scope, each pruned entry ranks at most as high as each kept one (ties may go either way)."""
    for scope in scopes.unique().tolist():
        if scope < 0:
            continue
        inside = scopes == scope
        cut = [rank(v) for v in ranked[inside & pruned].tolist()]
        kept = [rank(v) for v in ranked[inside & ~pruned].tolist()]
        if cut and kept:
            assert max(cut) <= min(kept), f"scope {scope}: pruned {max(cut)} while keeping {min(kept)}"


VALUES = st.sampled_from([NAN, -math.inf, math.inf, 0.0, -0.0]) | st.integers(-8, 8).map(lambda i: i / 4)


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    rows=st.integers(1, 3),
    groups=st.integers(1, 3),
    fraction=st.sampled_from([0.0, 0.25, 0.5, 0.75]),
    large=st.booleans(),
)
def test_every_selection_path_prunes_nan_before_any_number(
    path: str, data: st.DataObject, rows: int, groups: int, fraction: float, large: bool
) -> None:
    values = data.draw(st.lists(VALUES, min_size=rows * groups * M, max_size=rows * groups * M))
    scores = torch.tensor(values, dtype=torch.float32).view(rows, groups * M)
    if large and path not in SMALL_ONLY:  # past the topk cutoff: the radix select
        repeats = TOPK_CUTOFF["cpu"] // scores.numel() + 1
        scores = scores.repeat(1, repeats)
    pruned, ranked, scopes = PATHS[path](scores, fraction)
    assert pruned.shape == scores.shape and pruned.dtype == torch.bool
    assert_nan_first(pruned, ranked, scopes)


@pytest.mark.parametrize("path", ["lowest_per_row", "keep_highest_per_row", "magnitude_row"])
def test_row_and_matrix_scopes_agree_on_a_row_with_one_nan(path: str) -> None:
    """The issue's example: at 25 % of ``[[nan, 1, 2, 3]]`` every scope prunes the NaN."""
    scores = torch.tensor([[NAN, 1.0, 2.0, 3.0]])
    row, _, _ = PATHS[path](scores, 0.25)
    matrix, _, _ = PATHS["magnitude_matrix"](scores, 0.25)
    assert row.tolist() == matrix.tolist() == [[True, False, False, False]]


def test_nan_ranks_below_minus_infinity_in_the_row_ranking() -> None:
    scores = torch.tensor([[NAN, -math.inf, 0.0]])
    assert toolkit.lowest_per_row(scores, 1 / 3).tolist() == [[True, False, False]]
    assert toolkit.lowest_n_of_m(scores.repeat(1, 2)[:, :4], 1, 4).tolist() == [[True, False, False, False]]
    assert toolkit.keep_highest_per_row(scores, torch.ones(1, 3, dtype=torch.bool), 2).tolist() == [[False, True, True]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_rule_holds_in_every_float_dtype(dtype: torch.dtype) -> None:
    scores = torch.tensor([[1.0, NAN, -math.inf, 0.5]], dtype=dtype)
    nan_only = [[False, True, False, False]]
    assert toolkit.lowest_per_row(scores, 0.25).tolist() == nan_only
    assert toolkit.lowest_n_of_m(scores, 1, 4).tolist() == nan_only
    assert toolkit.lowest_overall(scores, 0.25).tolist() == nan_only
    assert toolkit.top_indices(scores, 1).tolist() == [1]
    kept = toolkit.keep_highest_per_row(scores, torch.ones_like(scores, dtype=torch.bool), 3)
    assert kept.tolist() == [[True, False, True, True]]
