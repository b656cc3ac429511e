"""One-shot pruning of an FSDP2-sharded model (gloo, CPU): each block gathered whole once, its shards rewritten.

Each world size is one launch of tests/support/calibration_ranks.py (its
``fsdp_`` cases: a tiny Llama with ``fully_shard`` on each block and the
root); every rank's model is compared with the same run in one process on the
unsharded model, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from tests.support.calibration_ranks import (
    FSDP_RUNS,
    check_refusals,
    rank_test_marks,
    same_as_alone_from_shares,
    values,
    worlds_fixture,
)
from tests.support.processes import run_example_under_torchrun

pytestmark = rank_test_marks()

worlds = worlds_fixture("fsdp_")

SIZES = (2, 3)

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "oneshot_fsdp.py"


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", FSDP_RUNS)
def test_every_rank_shards_hold_the_model_one_process_prunes_unsharded(worlds, size, name):
    same_as_alone_from_shares(worlds, size, f"fsdp_{name}")
    for found in values(worlds[size], f"fsdp_{name}"):
        assert found["own_shards"]  # each rank's shards, cut as FSDP2 cuts dim 0
        assert found["logits"]  # the sharded model's forward after it: the pruned model's logits


@pytest.mark.parametrize("size", SIZES)
def test_with_permanent_false_the_masks_are_sharded_like_the_weights_and_remove_gives_the_pruned_model(worlds, size):
    for found in values(worlds[size], "fsdp_masks"):
        assert found["masks"] == 3 * 7  # q, k, v, o, gate, up, down in three blocks
        assert found["same"] and found["own_shards"] and found["laid_out"] and found["logits"]


@pytest.mark.parametrize("size", SIZES)
def test_each_block_is_gathered_once_and_given_back_before_the_next_after_a_forward_left_them_gathered(worlds, size):
    for found in values(worlds[size], "fsdp_gathered_one_block_at_a_time"):
        # at every solve, only the block being pruned is whole; the blocks come in order
        assert all(len(whole) == 1 for whole in found["whole_at_solves"])
        blocks = [whole[0] for whole in found["whole_at_solves"]]
        assert blocks == sorted(blocks) and set(blocks) == {0, 1, 2}
        # every parameter gathered once: each block's for its pass, the rest (embeddings, norm, head) for the capture
        assert found["gathers"] == found["parameters"]
        assert found["sharded_after"]
        assert found["logits"]  # the blocks' gathered copies from a forward before were not what it pruned


@pytest.mark.parametrize("size", SIZES)
def test_what_cannot_run_on_a_sharded_model_is_refused_in_one_line_leaving_the_shards_as_they_were(worlds, size):
    expected = {
        "shrink": ("NotImplementedError", "prunereg.shrink cannot change the shapes of a sharded model's parameters"),
        "not_data_parallel": ("ValueError", "prunereg.oneshot: the model is sharded (DTensor parameters)"),
        "mesh_2d": (
            "NotImplementedError",
            "prunereg.oneshot: model.embed_tokens.weight is sharded over the device mesh [[0, ",
        ),
        "grouped": ("NotImplementedError", "prunereg.oneshot: model.layers.0 was sharded by one fully_shard call"),
        "tensor_parallel": ("NotImplementedError", "prunereg.oneshot: model.layers.1.mlp.up_proj.weight is a DTensor"),
    }
    check_refusals(values(worlds[size], "fsdp_refused"), expected)


@pytest.mark.parametrize("size", SIZES)
def test_a_rank_that_raises_midway_stops_every_rank_with_the_shards_put_back(worlds, size):
    for rank, found in enumerate(values(worlds[size], "fsdp_one_rank_raises")):
        if rank == 1:
            assert (found["error"], found["message"]) == ("RuntimeError", "rank one's method broke")
        else:
            assert found["error"] == "RankFailed" and found["message"].startswith(f"rank 1 of {size} failed: ")
        assert found["unchanged"] and found["sharded"] and found["logits"]
    # rank 1 fails with its block 1 gathered and pruned: the shards get the values from before, not the pruned ones
    errors = [found["error"] for found in values(worlds[size], "fsdp_rank_raises_after_writing_a_block")]
    assert errors == ["RankFailed", "RuntimeError", *["RankFailed"] * (size - 2)]
    assert all(
        found["unchanged"] and found["sharded"]
        for found in values(worlds[size], "fsdp_rank_raises_after_writing_a_block")
    )


def test_the_docs_example_runs_under_torchrun_and_its_shards_hold_the_one_process_model():
    """docs/distributed.md's FSDP2 example, run as it tells the user to, on two CPU ranks."""
    process = run_example_under_torchrun(EXAMPLE)
    assert process.returncode == 0, process.stdout
    assert "same weights as one process: True, same logits: True, on 2 ranks" in process.stdout, process.stdout
