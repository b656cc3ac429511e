"""Which rank solves each of a block's groups: every rank computes the same shares, balanced by cost."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from prunereg._runtime.ranks import owners

costs_lists = st.lists(st.floats(min_value=0, max_value=1e12, allow_nan=False), max_size=40)


@given(costs_lists, st.integers(1, 9))
def test_each_item_has_one_rank_and_the_ranks_share_the_work_within_the_largest_item(costs, size):
    owner = owners(costs, size)
    assert len(owner) == len(costs) and all(0 <= rank < size for rank in owner)
    assert owner == owners(list(costs), size)  # a pure function of the costs: every rank finds the same
    loads = [sum(cost for cost, rank in zip(costs, owner) if rank == r) for r in range(size)]
    # the greedy bound: the busiest rank is at most the mean load plus the costliest item
    assert max(loads) <= sum(costs) / size + max(costs, default=0) + 1e-6 * sum(costs)
    if len(costs) >= size:  # no rank idles while there are items for all
        assert set(owner) == set(range(size))


def test_the_costliest_groups_go_to_different_ranks_first():
    # tiny Llama's q/k/v, o_proj, gate/up, down_proj costs: down and gate/up on ranks 0 and 1, the rest balanced
    assert owners([98304, 65536, 131072, 184320], 2) == [1, 0, 1, 0]
    assert owners([98304, 65536, 131072, 184320], 3) == [2, 2, 1, 0]
    assert owners([1.0, 1.0, 1.0], 3) == [0, 1, 2]
    assert owners([0.0, 0.0, 0.0, 0.0], 2) == [0, 1, 0, 1]  # equal loads: the rank with fewer items
