"""Recover a shrunk language model sharded with FSDP2 by refit, one gathered block at a time.

Run on one machine, with two CPU processes:

    torchrun --standalone --nproc-per-node 2 docs/examples/recover_fsdp.py

(with GPUs, ``--nproc-per-node`` the number of GPUs: each process takes one and
NCCL carries the collectives). The model is a small Llama built from its
config (random weights, nothing to download), shrunk before it is sharded
(FSDP2 cannot follow a change of shapes); the teacher, the model before
shrinking, is sharded too. Each rank also recovers an unsharded copy alone,
to show that its shards hold that model's values.
"""

from __future__ import annotations

import copy
import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import init_device_mesh
from transformers import LlamaConfig, LlamaForCausalLM

import prunereg


def main() -> None:
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    recover_sharded_llm("cuda" if use_cuda else "cpu")
    dist.barrier()
    # FSDP2's hooks hold the process group in reference cycles: collect them while
    # Python still runs, or gloo's threads may abort the process as it exits.
    gc.collect()
    dist.destroy_process_group()


def sharded(model: nn.Module, device: str) -> nn.Module:
    """FSDP2's standard recipe: each decoder block, then the root, over every rank."""
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    for block in model.model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def recover_sharded_llm(device: str) -> None:
    torch.manual_seed(0)  # every rank builds the same model and draws the same samples
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    teacher = LlamaForCausalLM(config).to(device).eval()
    calibration = torch.randint(0, 256, (8, 32), device=device)
    model = copy.deepcopy(teacher)
    prunereg.shrink(model, "flap", calibration, mlp=0.5, batch_size=2, data_parallel=False)  # every rank alike
    alone, alone_teacher = copy.deepcopy(model), copy.deepcopy(teacher)

    # Each rank runs its share of the samples; each block of both models is gathered whole in turn, and the
    # recovered values are written back into the model's shards. A sharded model gains no biases: bias=False.
    report = prunereg.recover(
        sharded(model, device), sharded(teacher, device), calibration, "refit", bias=False, batch_size=2
    )

    # The same recovery, unsharded, in this process alone: the shards hold its values.
    prunereg.recover(alone, alone_teacher, calibration, "refit", bias=False, batch_size=2, data_parallel=False)
    whole = dict(alone.named_parameters())
    same = all(torch.equal(p.full_tensor(), whole[name]) for name, p in model.named_parameters())
    with torch.no_grad():  # FSDP2 gathers the recovered values for the forward
        logits = torch.equal(model(calibration).logits, alone(calibration).logits)

    if dist.get_rank() == 0:
        print(f"blocks refit: {sum(bool(step.changed) for step in report.steps)} of {len(report.steps)}")
        print(f"same weights as one process: {same}, same logits: {logits}, on {dist.get_world_size()} ranks")


if __name__ == "__main__":
    main()
