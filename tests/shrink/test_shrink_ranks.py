"""Shrinking under torch.distributed (gloo, CPU): each rank calibrates on its share, all end as one process.

FLAP's moments (merged with their counts), Wanda-sp's norms and the blocks'
cosines are combined over the ranks; each case of tests/support/calibration_ranks.py
is compared with the same run in this process, over all the samples, bit for bit.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist

pytest.importorskip("transformers")

from tests.support.calibration_ranks import SHRINK_RUNS, launch, run_shrink, values

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="needs the gloo backend")

WORLD_SIZES = (1, 2, 3)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, dict[str, Any]]]]:
    return {size: launch(size, tmp_path_factory.mktemp(f"world{size}"), "shrink_") for size in WORLD_SIZES}


@pytest.mark.parametrize("size", WORLD_SIZES)
@pytest.mark.parametrize("name", list(SHRINK_RUNS))
def test_every_rank_ends_with_the_model_one_process_shrinks_from_all_the_samples(worlds, size, name):
    alone = run_shrink(name)
    per_rank = values(worlds[size], f"shrink_{name}")
    assert [r["state"] for r in per_rank] == [alone["state"]] * size
    # each rank ran only its share of the batches through the model (the embedding sees each once)
    assert sum(r["batches"] for r in per_rank) == alone["batches"]
    if size > 1:
        assert all(r["batches"] < alone["batches"] for r in per_rank)
