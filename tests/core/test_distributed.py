"""Pruning sharded (DTensor, FSDP2) models over gloo on CPU, with 2 and 4 ranks.

Each world size is one launch of tests/support/distributed_worker.py, which forks the
ranks; every case there compares the gathered masks with
``torch.nn.utils.prune`` on the full tensors. The launch happens once per world
size, when a test first asks for it, and each case is reported as its own test.
Every launch forks real processes (the 2-rank one takes 20 CPU-seconds), so
the module is ``slow``, as the project marks tests that start processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.support.processes import Worlds, run_example_under_torchrun

# Each test starts real processes (a world of ranks, or torchrun): slow, as the project marks them.
pytestmark = [pytest.mark.skipif(not dist.is_gloo_available(), reason="needs the gloo backend"), pytest.mark.slow]

WORKER = Path(__file__).resolve().parents[1] / "support" / "distributed_worker.py"
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "prune_sharded.py"
WORLD_SIZES = (2, 4)
LAUNCH_TIMEOUT_S = 300


def launch(world_size: int, tmp_path: Path, device: str = "cpu") -> dict[str, dict[str, object]]:
    """Run every case on ``world_size`` ranks; rank 0's results, after checking all ranks agree."""
    results = tmp_path / "results"
    env = dict(os.environ, OMP_NUM_THREADS="1", PRUNEREG_TEST_DEVICE=device)
    process = subprocess.run(
        [sys.executable, str(WORKER), str(results), str(world_size)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
    )
    assert process.returncode == 0, f"the ranks exited with {process.returncode}:\n{process.stdout}"
    per_rank = [json.loads(Path(f"{results}.{rank}").read_text()) for rank in range(world_size)]
    for rank, found in enumerate(per_rank[1:], start=1):
        for name, result in found.items():
            if result["ok"]:
                assert result == per_rank[0][name], f"ranks 0 and {rank} disagree on {name}"
    failures = {name: r for found in per_rank for name, r in found.items() if not r["ok"]}
    return per_rank[0] | failures


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Worlds[dict[str, dict[str, object]]]:
    """The launches, shared by the tests below (one per world size)."""
    return Worlds(lambda size: launch(size, tmp_path_factory.mktemp(f"world{size}")))


CASE_NAMES = [
    "l1_unstructured",
    "l1_unstructured_importance_scores",
    "ln_structured",
    "ln_structured_zero_norm",
    "seeded_shapes",
    "random_unstructured",
    "random_structured",
    "mixed_successive_pruning",
    "random_unstructured_twice",
    "global_unstructured",
    "global_unstructured_random",
    "custom_from_mask_and_identity",
    "two_dimensional_mesh",
    "compact_masks",
    "bad_input_leaves_module_unchanged",
    "state_dict_and_deepcopy",
    "remove_leaves_dtensor_parameters",
    "fsdp_forward_after_remove",
    "fsdp_forward_while_pruned",
    "no_weights_cross_the_network",
]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_case(worlds: Worlds, name: str, world_size: int) -> None:
    result = worlds[world_size][name]
    assert result["ok"], result.get("error")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_case_is_run(worlds: Worlds, world_size: int) -> None:
    assert sorted(worlds[world_size]) == sorted(CASE_NAMES)


def test_random_masks_do_not_depend_on_the_number_of_ranks(worlds: Worlds) -> None:
    masks = [worlds[n]["random_unstructured_twice"]["value"] for n in WORLD_SIZES]
    assert masks[0] is not None and all(m == masks[0] for m in masks)


@pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(), reason="needs CUDA and NCCL")
def test_every_case_with_nccl_on_cuda(tmp_path: Path) -> None:
    """The same cases on CUDA, one GPU per rank (two ranks where there are two GPUs)."""
    found = launch(min(2, torch.cuda.device_count()), tmp_path, device="cuda")
    failures = {name: result["error"] for name, result in found.items() if not result["ok"]}
    assert sorted(found) == sorted(CASE_NAMES)
    assert not failures, "\n".join(f"{name}:\n{error}" for name, error in failures.items())


def test_docs_example_runs_under_torchrun() -> None:
    """docs/distributed.md's example, run as it tells the user to, on two CPU ranks."""
    process = run_example_under_torchrun(EXAMPLE, timeout=LAUNCH_TIMEOUT_S)
    assert process.returncode == 0, process.stdout
    assert "pruned on 2 ranks" in process.stdout, process.stdout


COMMAND_GROUP_PROGRAM = """
import os
import torch.distributed as dist
from prunereg._runtime.ranks import launched_group

with launched_group(None):
    import torch._dynamo  # what loading a transformers model inside a command imports
    dist.barrier()
threads = [open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task")]
print(f"rank {os.environ['RANK']} gloo threads after the group: {sorted(t for t in threads if 'gloo' in t)}")
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the threads from /proc")
def test_a_commands_group_is_gone_with_its_threads_when_the_command_ends(tmp_path: Path) -> None:
    """The group a command starts under torchrun is freed at its end, even where the command imported torch._dynamo.

    Imported inside the group, ``torch.distributed.fsdp`` held it past
    ``destroy_process_group``; gloo's threads outlived the interpreter and now
    and then aborted a command at exit, after its output was written.
    """
    program = tmp_path / "command.py"
    program.write_text(COMMAND_GROUP_PROGRAM)
    process = run_example_under_torchrun(program, timeout=LAUNCH_TIMEOUT_S)
    assert process.returncode == 0, process.stdout
    for rank in (0, 1):
        assert f"rank {rank} gloo threads after the group: []" in process.stdout, process.stdout
