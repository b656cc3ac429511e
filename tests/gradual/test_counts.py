"""What gradual pruning counts as pruned: the zeros of a mask of any dtype, entries or whole channels."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunereg._distributed.counts import pruned_channels, pruned_entries


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.bool]),
    share=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_the_counts_are_the_zeros_of_the_mask_and_the_all_zero_channels(shape, dtype, share, seed):
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.rand(shape, generator=generator) >= share).to(dtype)
    assert pruned_entries(mask) == int((mask == 0).sum())
    for dim in range(-mask.dim(), mask.dim()):
        others = [d for d in range(mask.dim()) if d != dim % mask.dim()]
        expected = int(((mask != 0).sum(dim=others) == 0).sum()) if others else int((mask == 0).sum())
        assert pruned_channels(mask, dim) == expected


def test_nan_in_a_mask_is_not_a_zero():
    assert pruned_entries(torch.tensor([0.0, float("nan"), 1.0, 0.5])) == 1
