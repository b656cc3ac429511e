"""The ranks of tests/gradual/test_sharded.py: GradualPruning of sharded models against the same on full ones.

``gradual_ranks.py RESULTS WORLD_SIZE``: distributed_worker.py's launcher and
result files, running the cases below instead of its own. Each builds that
worker's model on every rank, shards a copy (rows, columns, FSDP2), prunes both
on one schedule, moving the weights between steps, and compares the gathered
masks and weights (rewound ones too) after every step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import prunereg
from tests.support import distributed_worker as worker

CASES = {
    "global_l1": ("l1_unstructured", {"globally": True}),
    "l1_per_parameter": ("l1_unstructured", {}),
    "ln_structured": ("ln_structured", {"n": 2, "dim": 0}),
    "global_l1_rewound": ("l1_unstructured", {"globally": True, "rewind_to": 2}),
}


def run_case(method: str, options: dict[str, object]) -> None:
    schedule = prunereg.schedule("cubic", final=0.8, start=1, end=7, every=2)
    for layout in worker.LAYOUTS:
        reference = worker.full_model()
        ours = worker.sharded(reference, layout)
        pruners = [prunereg.GradualPruning(model, method, schedule, **options) for model in (ours, reference)]
        for step in range(1, 9):
            for model, pruner in zip((ours, reference), pruners):
                with torch.no_grad():  # a stand-in for training: every weight moves between steps
                    for layer in worker.linears(model):
                        layer.weight_orig.mul_(1.0 + step / 8)
                pruner.step()
            for mine, theirs in zip(worker.linears(ours), worker.linears(reference)):
                mask = mine.weight_mask
                assert mask.placements == mine.weight_orig.placements, layout
                assert torch.equal(mask.full_tensor(), theirs.weight_mask), (layout, step)
                assert torch.equal(mine.weight_orig.full_tensor(), theirs.weight_orig), (layout, step)
        assert pruners[0].sparsities() == pruners[1].sparsities(), layout


if __name__ == "__main__":
    worker.CASES.clear()
    for name, (method, options) in CASES.items():
        worker.CASES[name] = lambda method=method, options=options: run_case(method, options)
    worker.main()
