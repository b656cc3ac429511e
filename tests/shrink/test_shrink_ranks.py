"""Shrinking under torch.distributed (gloo, CPU): each rank calibrates on its share, all end as one process.

FLAP's moments (merged with their counts), Wanda-sp's norms and the blocks'
cosines are combined over the ranks; each case of tests/support/calibration_ranks.py
is compared with the same run in this process, over all the samples, bit for bit.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

pytest.importorskip("transformers")

from tests.support.calibration_ranks import (
    SHRINK_RUNS,
    WORLD_SIZES,
    same_as_alone_from_shares,
    worlds_fixture,
)

# Each test starts real processes (a world of ranks, or torchrun): slow, as the project marks them.
pytestmark = [pytest.mark.skipif(not dist.is_gloo_available(), reason="needs the gloo backend"), pytest.mark.slow]


worlds = worlds_fixture("shrink_")  # every case launched at 1, 2 and 3 ranks (2 in the fast loop)


@pytest.mark.parametrize("size", WORLD_SIZES)
@pytest.mark.parametrize("name", list(SHRINK_RUNS))
def test_every_rank_ends_with_the_model_one_process_shrinks_from_all_the_samples(worlds, size, name):
    same_as_alone_from_shares(worlds, size, f"shrink_{name}")
