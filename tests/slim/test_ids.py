"""The channel-id union-find: coupling whole arrays at once, and the cached classes read after building."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunereg._slim.ids import Ids

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


@SETTINGS
@given(
    size=st.integers(2, 24),
    data=st.data(),
)
def test_coupling_arrays_at_once_makes_the_classes_and_keeps_the_pins_that_pair_by_pair_unions_do(
    size: int, data: st.DataObject
) -> None:
    positions = st.lists(st.integers(0, size - 1), min_size=1, max_size=3 * size)
    first = data.draw(positions)
    second = data.draw(st.lists(st.integers(0, size - 1), min_size=len(first), max_size=len(first)))
    pins = data.draw(st.dictionaries(st.integers(0, size - 1), st.sampled_from(["input", "output", "ignored"])))
    by_array, by_pair = Ids(), Ids()
    for ids in (by_array, by_pair):
        ids.fresh(size)
        for index, reason in pins.items():
            ids.pin(torch.tensor([index]), reason)
    by_array.union_arrays(torch.tensor(first), torch.tensor(second))
    for a, b in zip(first, second, strict=True):
        by_pair.union(a, b)
    assert torch.equal(by_array.all_roots(), by_pair.all_roots())
    assert [by_array.pin_reason(i) for i in range(size)] == [by_pair.pin_reason(i) for i in range(size)]


def test_the_classes_read_at_once_follow_every_coupling_and_id_made_after_they_were_last_read() -> None:
    ids = Ids()
    ids.fresh(4)
    assert ids.all_roots().tolist() == [0, 1, 2, 3]
    ids.union(3, 2)
    assert ids.all_roots().tolist() == [0, 1, 2, 2]
    ids.fresh(2)
    assert ids.all_roots().tolist() == [0, 1, 2, 2, 4, 5]
    ids.union_arrays(torch.tensor([5, 1]), torch.tensor([2, 0]))
    assert ids.all_roots().tolist() == [0, 0, 2, 2, 4, 2]
