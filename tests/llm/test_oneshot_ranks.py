"""One-shot pruning under torch.distributed (gloo, CPU): each rank calibrates on its share, all end as one process.

Each world size is one launch of tests/support/calibration_ranks.py (forked
ranks, one thread each); every case there is compared here with the same run in
this process, over all the samples, bit for bit.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest

pytest.importorskip("transformers")

from tests.support.calibration_ranks import (
    ONESHOT_RUNS,
    WORLD_SIZES,
    folder_digest,
    launch,
    oneshot_arguments,
    rank_test_marks,
    run_oneshot_command,
    run_oneshot_folder,
    same_as_alone,
    under_torchrun,
    values,
    worlds_fixture,
)

pytestmark = rank_test_marks()

N_BATCHES = {
    "wanda": 4,
    "sparsegpt": 7,
    "sparsegpt_2_4": 3,
    "wanda_owl": 7,
    "wanda_mixtral": 7,
}  # 7 samples in batches of batch_size


worlds = worlds_fixture("oneshot_")  # every case launched at 1, 2 and 3 ranks


@pytest.mark.parametrize("size", WORLD_SIZES)
@pytest.mark.parametrize("name", list(ONESHOT_RUNS))
def test_every_rank_ends_with_the_model_one_process_makes_from_all_the_samples(worlds, size, name):
    alone, batches = same_as_alone(worlds, size, f"oneshot_{name}")
    n = N_BATCHES[name]
    passes = 2 if "owl" in name else 1  # OWL's outlier pass runs the samples through the model once more
    assert alone == passes * n
    # each rank ran a contiguous share of the batches through the model
    assert batches == [passes * (n * (rank + 1) // size - n * rank // size) for rank in range(size)]


@pytest.mark.parametrize("size", (2, 3))
@pytest.mark.parametrize("name", ["sparsegpt", "wanda"])
def test_each_group_of_a_block_is_solved_on_one_rank_and_every_rank_solves_its_share(worlds, size, name):
    alone, solves = same_as_alone(worlds, size, f"oneshot_{name}", counted="solves")
    assert alone == 3 * 4  # q/k/v, o_proj, gate/up and down_proj of three blocks
    assert sum(solves) == alone  # each solved once, on one rank
    assert min(solves) >= 3  # every rank solves at least one group of each block (4 groups, at most 3 ranks)


def test_a_merge_of_statistics_holds_one_other_ranks_payload_at_a_time(worlds):
    # at 3 ranks, when the last rank's partial Hessians are loaded, the second's are combined in and gone already
    found = values(worlds[3], "oneshot_sparsegpt")
    # rank 0's partials, which the later ones are combined into, stay whole on every rank; nothing else does
    assert [each["most_whole"] for each in found] == [1, 1, 1]
    assert [each["merge_loads"] for each in found] == [3 * 3] * 3  # three blocks' merges, one load per rank


def test_a_ranks_own_statistics_are_let_go_once_sent_and_its_own_turn_combines_a_copy(worlds):
    # once serialized, a rank's own partial Hessians are held by nothing while the others' arrive: at 70B, a block's
    # worth of them (4 GB) less on every rank; and the merge never combines into the recorder's own objects
    found = values(worlds[3], "oneshot_sparsegpt")
    assert all(each["own_statistics_tracked"] > 0 for each in found)
    assert [each["own_statistics_alive"] for each in found] == [0, 0, 0]


@pytest.mark.parametrize("size", (2, 3))
def test_every_rank_takes_each_result_from_the_rank_that_solved_it(worlds, size):
    # the method prunes more on each later rank: the ranks' models agree only where each writes the solver's result
    found = values(worlds[size], "oneshot_solved_by_one_rank")
    assert [each["state"] for each in found] == [found[0]["state"]] * size
    assert sum(each["solves"] for each in found) == 2 * 4


@pytest.mark.parametrize("size", (2, 3))
def test_ranks_that_disagree_on_the_settings_are_refused_on_every_rank_before_any_change(worlds, size):
    for found in values(worlds[size], "oneshot_refused_when_ranks_disagree"):
        assert found["error"] == "ValueError" and found["unchanged"]
        assert found["message"].startswith(
            f"prunereg.oneshot: the ranks disagree on the settings (rank 1 of {size} differs from rank 0); "
        )


@pytest.mark.parametrize("size", (2, 3))
def test_a_rank_that_raises_ends_every_rank_with_its_error_and_every_model_as_it_was(worlds, size):
    found = values(worlds[size], "oneshot_one_rank_raises")
    assert found[1] == {"error": "RuntimeError", "message": "rank one's method broke", "unchanged": True}
    for rank, other in enumerate(found):
        if rank != 1:
            assert other == {
                "error": "RankFailed",
                "message": f"rank 1 of {size} failed: RuntimeError: rank one's method broke",
                "unchanged": True,
            }


@pytest.mark.parametrize("size", (2, 3))
def test_a_rank_whose_combine_of_the_statistics_raises_ends_every_rank_with_its_error(worlds, size):
    # rank 1 raises while the others' partials still come to it one rank at a time: no rank waits for it
    found = values(worlds[size], "oneshot_combine_raises")
    assert found[1] == {"error": "RuntimeError", "message": "rank one's combine broke", "unchanged": True}
    message = f"rank 1 of {size} failed: RuntimeError: rank one's combine broke"
    assert [other for rank, other in enumerate(found) if rank != 1] == [
        {"error": "RankFailed", "message": message, "unchanged": True}
    ] * (size - 1)


@pytest.fixture(scope="module")
def two_ranks_writing(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, dict[str, Any]]]:
    return launch(2, tmp_path_factory.mktemp("folders"), "folder_")


def test_oneshot_folder_on_two_ranks_is_written_once_by_rank_zero_and_complete_when_each_returns(
    two_ranks_writing, tmp_path
):
    (tmp_path / "alone").mkdir()
    alone = run_oneshot_folder(tmp_path / "alone")
    for found in values(two_ranks_writing, "folder_oneshot"):  # no staging folder of any rank is left beside it
        assert found == {"folder": alone, "entries": ["pruned", "source"]}  # the cases after it make more


@pytest.mark.parametrize(("case", "flags"), [("folder_command", ()), ("folder_command_streamed", ("--stream",))])
def test_the_oneshot_command_under_two_ranks_writes_the_one_process_folder_from_rank_zero(
    two_ranks_writing, tmp_path, case, flags
):
    (tmp_path / "alone").mkdir()
    alone = run_oneshot_command(tmp_path / "alone", *flags)
    assert alone["code"] == 0 and alone["folder"] is not None, alone["output"]
    rank_zero, rank_one = values(two_ranks_writing, case)
    assert (rank_zero["code"], rank_zero["folder"]) == (0, alone["folder"])
    first_line = alone["output"].split(",")[0]  # "sparsegpt: 14 layers in 2 blocks pruned to 50% (uniform)"
    assert rank_zero["output"].startswith(first_line) and "wrote " in rank_zero["output"]
    assert rank_one == {"code": 0, "folder": alone["folder"], "output": ""}  # it waited for rank 0's folder


def test_the_oneshot_command_under_torchrun_initializes_the_ranks_and_writes_the_one_process_folder(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    alone = run_oneshot_command(work)  # also saves the source folder and the text the ranks read
    shutil.rmtree(work / "pruned")
    done = under_torchrun(oneshot_arguments(work))
    assert done.returncode == 0, done.stdout + done.stderr
    assert folder_digest(work / "pruned") == alone["folder"]
    assert done.stdout.count("wrote ") == 1  # rank 0 alone reports


def test_a_rank_that_dies_midway_ends_rank_zero_with_an_error_and_no_output_folder(tmp_path):
    rank_zero, rank_one = launch(2, tmp_path / "ranks", "dies_", a_rank_dies=True)
    assert rank_one is None  # it died before writing anything
    found = rank_zero["dies_folder_oneshot"]
    assert found["ok"], found.get("error")
    assert found["value"]["error"] is not None and found["value"]["left"] == ["source"]
