"""Shrinking under torch.distributed (gloo, CPU): each rank calibrates on its share, all end as one process.

FLAP's moments (merged with their counts), Wanda-sp's norms and the blocks'
cosines are combined over the ranks; each case of tests/support/calibration_ranks.py
is compared with the same run in this process, over all the samples, bit for bit.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tests.support.calibration_ranks import (
    SHRINK_RUNS,
    WORLD_SIZES,
    rank_test_marks,
    same_as_alone_from_shares,
    worlds_fixture,
)

pytestmark = rank_test_marks()


worlds = worlds_fixture("shrink_")  # every case launched at 1, 2 and 3 ranks


@pytest.mark.parametrize("size", WORLD_SIZES)
@pytest.mark.parametrize("name", list(SHRINK_RUNS))
def test_every_rank_ends_with_the_model_one_process_shrinks_from_all_the_samples(worlds, size, name):
    same_as_alone_from_shares(worlds, size, f"shrink_{name}")
