"""Recovery of an FSDP2-sharded model (gloo, CPU): each block, and its teacher's, gathered whole in turn.

Each world size is one launch of tests/support/calibration_ranks.py (its
``sharded_recover_`` cases: a tiny Llama shrunk or pruned in one process,
then sharded with ``fully_shard`` on each block and the root, recovered
against its teacher, sharded or not); every rank's shards are compared with
the same recovery in one process on the unsharded model, bit for bit.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from tests.support.calibration_ranks import (
    RECOVER_RUNS,
    SHARDED_RECOVER_RUNS,
    check_refusals,
    rank_test_marks,
    values,
    worlds_fixture,
)
from tests.support.processes import run_example_under_torchrun

pytestmark = rank_test_marks()

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "recover_fsdp.py"

worlds = worlds_fixture("sharded_recover_")


@pytest.mark.parametrize("size", (2, 3))
@pytest.mark.parametrize("name", list(SHARDED_RECOVER_RUNS))
def test_every_rank_shards_hold_the_model_one_process_recovers_unsharded(worlds, size, name):
    per_rank = values(worlds[size], f"sharded_recover_{name}")
    assert {found["state"] for found in per_rank} == {per_rank[0]["alone"]}
    for found in per_rank:
        assert found["state"] != found["unrecovered"]  # the recovery changed the model
        assert found["own_shards"] and found["sharded"]  # each rank's shards, cut as FSDP2 cuts dim 0
        assert found["logits"]  # the sharded model's forward after it: the recovered model's logits
        assert found["teacher_unchanged"]
    batches = [found["batches"] for found in per_rank]
    run = SHARDED_RECOVER_RUNS[name][0]
    assert sum(batches) == math.ceil(7 / RECOVER_RUNS[run][3]["batch_size"])  # each rank its share, each batch once
    assert min(batches) > 0


@pytest.mark.parametrize("size", (2, 3))
def test_what_recovery_cannot_do_on_a_sharded_model_is_refused_in_one_line_leaving_the_shards_as_they_were(
    worlds, size
):
    expected = {
        "new_biases": (
            "NotImplementedError",
            "prunereg.recover (model): 'refit' would give the sharded model new biases (",
        ),
        "not_data_parallel": ("ValueError", "prunereg.recover (model): the model is sharded (DTensor parameters)"),
        "teacher_not_data_parallel": (
            "ValueError",
            "prunereg.recover (teacher): the model is sharded (DTensor parameters)",
        ),
        "removed_blocks_unnamed": (
            "ValueError",
            "prunereg.recover (model): the teacher has 3 blocks in model.layers and the model 2",
        ),
    }
    check_refusals(values(worlds[size], "sharded_recover_refused"), expected)


@pytest.mark.parametrize("size", (2, 3))
def test_one_block_of_the_model_is_whole_while_it_is_recovered_and_none_of_the_teacher_nor_any_after(worlds, size):
    for found in values(worlds[size], "sharded_recover_one_block_at_a_time"):
        assert found["whole_at_recoveries"] == [[[0], []], [[1], []], [[2], []]]
        assert found["whole_after"] == [[], []]


def test_the_docs_example_runs_under_torchrun_and_its_shards_hold_the_one_process_recovery():
    """docs/distributed.md's FSDP2 recovery example, run as it tells the user to, on two CPU ranks."""
    process = run_example_under_torchrun(EXAMPLE)
    assert process.returncode == 0, process.stdout
    assert "same weights as one process: True, same logits: True, on 2 ranks" in process.stdout, process.stdout
    refit = re.search(r"blocks refit: (\d+) of 4", process.stdout)
    assert refit is not None and int(refit.group(1)) > 0, process.stdout
