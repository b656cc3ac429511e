"""Streamed shrinking under torch.distributed (gloo, CPU): ``shrink_folder`` and ``prunereg shrink --stream``.

Each rank streams the folder one block at a time and calibrates (and
recovers) on its share of the samples; rank 0 alone writes the output folder,
atomically, and the others return once it is in place. Each case of
tests/support/calibration_ranks.py is compared with the same run in this
process, streamed and in memory, bit for bit.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("transformers")

from tests.support.calibration_ranks import (
    STREAMED_SHRINK_RUNS,
    WORLD_SIZES,
    folder_digest,
    rank_test_marks,
    run_command,
    run_shrink_folder,
    shrink_arguments,
    under_torchrun,
    values,
    worlds_fixture,
)

pytestmark = rank_test_marks()


worlds = worlds_fixture("streamed_shrink_")  # every case launched at 1, 2 and 3 ranks


@pytest.mark.parametrize("size", WORLD_SIZES)
@pytest.mark.parametrize("name", list(STREAMED_SHRINK_RUNS))
def test_every_rank_returns_once_rank_zero_wrote_the_folder_one_process_writes_streamed_and_in_memory(
    worlds, size, name, tmp_path
):
    alone = run_shrink_folder(tmp_path / "alone", name)
    in_memory = run_shrink_folder(tmp_path / "in_memory", name, in_memory=True)
    assert alone["folder"] == in_memory["folder"]
    for found in values(worlds[size], f"streamed_shrink_{name}"):  # no staging or round folder is left beside it
        assert found == {"folder": alone["folder"], "entries": ["shrunk", "source"]}


@pytest.mark.parametrize(("case", "flags"), [("command", ("--stream",)), ("command_in_memory", ())])
def test_the_shrink_command_under_two_ranks_writes_the_one_process_folder_from_rank_zero(worlds, tmp_path, case, flags):
    alone = run_command(tmp_path, shrink_arguments(tmp_path, *flags))
    assert alone["code"] == 0 and alone["folder"] is not None, alone["output"]
    rank_zero, rank_one = values(worlds[2], f"streamed_shrink_{case}")
    assert (rank_zero["code"], rank_zero["folder"]) == (0, alone["folder"])
    first_line = alone["output"].split(", from")[0]  # "flap: 19,616 -> 12,224 parameters (62.3%), 0 blocks removed"
    assert (
        rank_zero["output"].startswith(first_line + ", from 112 calibration tokens") and "wrote " in rank_zero["output"]
    )
    assert rank_one == {"code": 0, "folder": alone["folder"], "output": ""}  # it waited for rank 0's folder


@pytest.mark.parametrize("size", (2, 3))
def test_a_rank_that_raises_midway_ends_every_rank_with_its_error_and_no_output_folder(worlds, size):
    found = values(worlds[size], "streamed_shrink_raises")
    assert found[1] == {
        "error": "RuntimeError",
        "message": "rank one's method broke",
        "left": ["calibration.txt", "source"],
    }
    for rank, other in enumerate(found):
        if rank != 1:
            assert other == {
                "error": "RankFailed",
                "message": f"rank 1 of {size} failed: RuntimeError: rank one's method broke",
                "left": ["calibration.txt", "source"],
            }


def test_the_streamed_shrink_command_under_torchrun_writes_the_one_process_folder(tmp_path):
    work = tmp_path / "work"
    alone = run_command(work, shrink_arguments(work, "--stream"))  # also saves the source folder and the text
    shutil.rmtree(work / "pruned")
    done = under_torchrun(shrink_arguments(work, "--stream"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert folder_digest(work / "pruned") == alone["folder"]
    assert done.stdout.count("wrote ") == 1  # rank 0 alone reports
