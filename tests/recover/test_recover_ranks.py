"""Recovery under torch.distributed (gloo, CPU): each rank holds its share of the batches, all end as one process.

The refits' float64 normal equations (exchanged as tensors only) and the
calibration losses are combined over the ranks, and a masked refit's solves
(one per distinct row mask) are shared among them; each case of
tests/support/calibration_ranks.py is compared with the same run in this
process, over all the samples, bit for bit. A method that trains on the
batches itself (blockwise, distill) is refused under ranks.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tests.support.calibration_ranks import (
    RECOVER_RUNS,
    WORLD_SIZES,
    rank_test_marks,
    same_as_alone,
    same_as_alone_from_shares,
    values,
    worlds_fixture,
)

pytestmark = rank_test_marks()


worlds = worlds_fixture("recover_")  # every case launched at 1, 2 and 3 ranks


@pytest.mark.parametrize("size", WORLD_SIZES)
@pytest.mark.parametrize("name", list(RECOVER_RUNS))
def test_every_rank_ends_with_the_model_one_process_recovers_from_all_the_samples(worlds, size, name):
    same_as_alone_from_shares(worlds, size, f"recover_{name}")


@pytest.mark.parametrize("size", (2, 3))
def test_a_masked_refit_solves_each_row_mask_on_one_rank_and_every_rank_solves_its_share(worlds, size):
    alone, solves = same_as_alone(worlds, size, "recover_refit_masked", counted="solves")
    assert alone == 3 * (32 + 32)  # every row of o_proj and down_proj has its own Wanda mask, in three blocks
    assert sum(solves) == alone  # each solved once, on one rank
    assert min(solves) > 0


@pytest.mark.parametrize("case", ["recover_blockwise_refused", "recover_shrink_blockwise_refused"])
def test_a_method_that_trains_on_the_batches_is_refused_on_every_rank_in_one_line(worlds, case):
    for found in values(worlds[2], case):
        assert found["error"] == "ValueError" and found["unchanged"], found
        assert "recover='blockwise'" in found["message"] and "data_parallel=False" in found["message"]
        assert "\n" not in found["message"]


def test_fewer_batches_than_ranks_are_refused_on_every_rank(worlds):
    for found in values(worlds[2], "recover_fewer_batches_than_ranks"):
        assert found["error"] == "ValueError" and found["unchanged"], found
        message = "2 ranks need a calibration batch each, and there are 1: give more samples or a smaller batch_size"
        assert found["message"] == message


def test_a_method_whose_blocks_differ_between_ranks_is_an_error_on_every_rank(worlds):
    for found in values(worlds[2], "recover_method_reads_its_own_share"):
        assert found["error"] == "RuntimeError", found
        assert found["message"].startswith("the ranks recovered model.layers.0 differently: the method read its own")
        assert found["unchanged"]  # the block put back on every rank, the bias it was given taken back
