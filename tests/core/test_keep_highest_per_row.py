"""keep_highest_per_row: the row-wise ranking shared by N:M and per-row methods."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunereg._selection.select import keep_highest_per_row


def reference_row(row: list[float], row_alive: list[bool], count: int) -> list[bool]:
    def rank(i: int) -> tuple[bool, float, int]:
        value = -math.inf if math.isnan(row[i]) else row[i]
        return (not row_alive[i], -value, i)

    kept = set(sorted(range(len(row)), key=rank)[:count])
    return [i in kept for i in range(len(row))]


def reference(scores: list[list[float]], alive: list[list[bool]], counts: list[int]) -> list[list[bool]]:
    return [reference_row(row, row_alive, count) for row, row_alive, count in zip(scores, alive, counts)]


@settings(max_examples=80, deadline=None)
@given(data=st.data(), rows=st.integers(1, 4), cols=st.integers(1, 6))
def test_matches_a_plain_python_ranking(data: st.DataObject, rows: int, cols: int) -> None:
    values = st.sampled_from([0.0, 1.0, -1.0, 2.5, float("nan"), float("inf")]) | st.floats(-3, 3)
    scores = data.draw(st.lists(st.lists(values, min_size=cols, max_size=cols), min_size=rows, max_size=rows))
    alive = data.draw(st.lists(st.lists(st.booleans(), min_size=cols, max_size=cols), min_size=rows, max_size=rows))
    counts = data.draw(st.lists(st.integers(0, cols), min_size=rows, max_size=rows))
    kept = keep_highest_per_row(torch.tensor(scores, dtype=torch.float64), torch.tensor(alive), torch.tensor(counts))
    assert kept.tolist() == reference(scores, alive, counts)


def test_an_int_count_applies_to_every_row_of_a_batched_tensor() -> None:
    scores = torch.tensor([[[3.0, 1.0, 2.0], [0.0, 0.0, 5.0]]])
    kept = keep_highest_per_row(scores, torch.ones_like(scores, dtype=torch.bool), 2)
    assert kept.tolist() == [[[True, False, True], [True, False, True]]]


def test_runs_on_meta() -> None:
    scores = torch.empty(3, 8, device="meta")
    kept = keep_highest_per_row(scores, torch.ones(3, 8, dtype=torch.bool, device="meta"), 2)
    assert (kept.shape, kept.dtype, kept.device.type) == ((3, 8), torch.bool, "meta")
