"""Prune a model sharded with FSDP2, without gathering its weights.

Run on one machine, with two CPU processes:

    torchrun --standalone --nproc-per-node 2 docs/examples/prune_sharded.py

(with GPUs, ``--nproc-per-node`` the number of GPUs: each process takes one and
NCCL carries the collectives).
"""

from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, init_device_mesh

import prunereg.prune as prune


def main() -> None:
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    prune_sharded_model("cuda" if use_cuda else "cpu")
    dist.barrier()
    # FSDP2's hooks hold the process group in reference cycles: collect them while
    # Python still runs, or gloo's threads may abort the process as it exits.
    gc.collect()
    dist.destroy_process_group()


def prune_sharded_model(device: str) -> None:
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    rank = dist.get_rank()

    # Every rank builds the same model; fully_shard then keeps only its own rows.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    layers = [m for m in model if isinstance(m, nn.Linear)]
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert isinstance(layers[0].weight, DTensor)

    # One threshold over all the weights: 80 % of them, those of smallest magnitude.
    prune.global_unstructured([(layer, "weight") for layer in layers], prune.L1Unstructured, amount=0.8)
    # Then the 10 % of the first layer's output rows with the smallest L2 norm.
    prune.ln_structured(layers[0], "weight", amount=0.1, n=2, dim=0)

    # The masks are DTensors sharded like the weights: count zeros shard by shard.
    zeros = torch.zeros(len(layers), dtype=torch.int64, device=device)
    for index, layer in enumerate(layers):
        assert layer.weight_mask.placements == layer.weight_orig.placements
        zeros[index] = int((layer.weight_mask.to_local() == 0).sum())
    dist.all_reduce(zeros)

    # Make the pruning permanent before the next forward: the weights stay sharded
    # DTensors, and FSDP2 now all-gathers the pruned values.
    for layer in layers:
        prune.remove(layer, "weight")
    with torch.no_grad():
        model(torch.randn(8, 64, device=device))

    if rank == 0:
        for layer, count in zip(layers, zeros.tolist()):
            print(f"{tuple(layer.weight.shape)}: {count / layer.weight.numel():.1%} pruned")
        total = sum(layer.weight.numel() for layer in layers)
        print(f"all weights: {sum(zeros.tolist()) / total:.1%} pruned on {dist.get_world_size()} ranks")


if __name__ == "__main__":
    main()
