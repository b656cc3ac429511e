"""The statistics shrink methods read: running moments merged batch by batch equal the float64 ones over all tokens."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunereg._shrink.architecture import Cut
from prunereg._shrink.gather import RunningMoments


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=6),
    offset=st.floats(min_value=-100, max_value=100),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_moments_merged_over_any_batches_equal_those_of_all_tokens_at_once(
    sizes: list[int], offset: float, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    batches = [torch.randn(size, 5, generator=generator, dtype=torch.float64) + offset for size in sizes]
    running = RunningMoments()
    for index, batch in enumerate(batches):  # [tokens, channels] or [batch, seq, channels]: every leading index a token
        running.add(batch.float().unsqueeze(0) if index % 2 else batch.float())
    tokens = torch.cat(batches)
    result = running.result()
    assert result.n_tokens == tokens.shape[0]
    assert result.mean is not None and result.variance is not None and result.sq_norms is not None
    torch.testing.assert_close(result.mean.double(), tokens.mean(0), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(result.sq_norms.double(), tokens.square().sum(0), rtol=1e-5, atol=1e-3)
    if tokens.shape[0] > 1:
        torch.testing.assert_close(result.variance.double(), tokens.var(0), rtol=1e-3, atol=1e-4)


def test_no_tokens_give_empty_statistics() -> None:
    running = RunningMoments()
    running.add(torch.empty(0, 4))
    assert running.result().n_tokens == 0 and running.result().mean is None


def test_a_cut_keeps_each_units_entries_in_every_segment() -> None:
    cut = Cut(torch.nn.Linear(1, 1), "weight", 0, ((0, 2), (6, 1)))  # units of 2 entries, then 1 entry each
    assert cut.kept_entries(torch.tensor([0, 2])).tolist() == [0, 1, 4, 5, 6, 8]
