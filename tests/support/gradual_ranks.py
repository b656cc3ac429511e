"""The ranks of tests/gradual/test_sharded.py: GradualPruning of sharded models against the same on full ones.

Run as ``gradual_ranks.py RESULTS WORLD_SIZE``: torch is imported once, the ranks
are forked, and each writes ``RESULTS.<rank>`` (JSON: per case, ok or the error).
Each case builds the model of distributed_worker.py on every rank, shards a copy
(rows, columns, FSDP2), prunes both on the same schedule and compares the
gathered masks after every step.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import prunereg
from tests.support.distributed_worker import LAYOUTS, full_model, linears, sharded

CASES = {
    "global_l1": ("l1_unstructured", {"globally": True}),
    "l1_per_parameter": ("l1_unstructured", {}),
    "ln_structured": ("ln_structured", {"n": 2, "dim": 0}),
}


def run_case(method: str, options: dict[str, object]) -> None:
    schedule = prunereg.schedule("cubic", final=0.8, start=1, end=7, every=2)
    for layout in LAYOUTS:
        reference = full_model()
        ours = sharded(reference, layout)
        pruners = [prunereg.GradualPruning(model, method, schedule, **options) for model in (ours, reference)]
        for step in range(1, 9):
            for pruner in pruners:
                pruner.step()
            for mine, theirs in zip(linears(ours), linears(reference)):
                mask = mine.weight_mask
                assert mask.placements == mine.weight_orig.placements, layout
                assert torch.equal(mask.full_tensor(), theirs.weight_mask), (layout, step)
        assert pruners[0].sparsities() == pruners[1].sparsities(), layout


def run_rank(rank: int, world: int, store: str, results: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    found: dict[str, dict[str, object]] = {}
    for name, (method, options) in CASES.items():
        try:
            run_case(method, options)
            found[name] = {"ok": True}
        except Exception:
            found[name] = {"ok": False, "error": traceback.format_exc()}
    Path(f"{results}.{rank}").write_text(json.dumps(found))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # as distributed_worker.py: skip gloo's teardown at interpreter exit


def main() -> None:
    results, world = sys.argv[1], int(sys.argv[2])
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=run_rank, args=(r, world, f"{results}.store", results)) for r in range(world)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()
    sys.exit(max(abs(process.exitcode or 0) for process in ranks))


if __name__ == "__main__":
    main()
