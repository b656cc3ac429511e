"""Pruning a model larger than the memory it is given: a synthetic Llama checkpoint, streamed block by block.

    python benchmarks/llm_streaming.py                       # 3.7 GB checkpoint, Wanda 50 %, peak RSS reported
    python benchmarks/llm_streaming.py --layers 4 --hidden 512 --intermediate 1408 --vocab 8000   # a quick one

Writes a Llama-architecture checkpoint of random float32 weights (one safetensors
shard per decoder block, as large checkpoints come) without ever holding it in
memory, then prunes it with ``prunereg.oneshot_folder`` in a fresh process whose
address space (``RLIMIT_AS``) may grow by only half the checkpoint's size beyond
what it held after importing torch and prunereg, and prints that process's peak
resident memory (``VmHWM``) beside the checkpoint's size. With ``--compare``,
a second process tries ``from_pretrained`` of the same folder under the same cap,
which needs the whole model in memory and fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GB = 1e9

_CHILD = r"""
import json, resource, sys, time
# Everything the run imports, and torch's thread pool, exist before the cap: it bounds the work only.
import accelerate, torch, transformers, prunereg, prunereg._oneshot.folder, prunereg_llm.wanda
from transformers.models.llama import modeling_llama
torch.set_num_threads(int(sys.argv[5]))
torch.ones(256, 256) @ torch.ones(256, 256)

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

budget = int(sys.argv[1])
limit = status("VmSize") + budget
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
mode, folder, output = sys.argv[2], sys.argv[3], sys.argv[4]
start = time.perf_counter()
try:
    if mode == "stream":
        ids = torch.randint(0, 1000, (int(sys.argv[6]), int(sys.argv[7])), generator=torch.Generator().manual_seed(0))
        report = prunereg.oneshot_folder(folder, output, "wanda", calibration=ids, sparsity=0.5, batch_size=4)
        result = {"ok": True, "sparsity": report.overall_sparsity, "timings": vars(report.timings)}
    else:
        transformers.AutoModelForCausalLM.from_pretrained(folder)
        result = {"ok": True}
except (MemoryError, RuntimeError, OSError) as error:
    result = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:120]}"}
result["seconds"] = time.perf_counter() - start
result["peak_rss"] = status("VmHWM")  # ru_maxrss would count the parent's memory at the fork
print(json.dumps(result))
"""


def write_checkpoint(folder: Path, *, layers: int, hidden: int, intermediate: int, vocab: int, heads: int) -> int:
    """A Llama checkpoint of random weights, one shard per block; returns its size in bytes."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    folder.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, tie_word_embeddings=False,
    )  # fmt: skip
    config.save_pretrained(folder)
    generator = torch.Generator().manual_seed(0)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.02

    shards = layers + 1
    weight_map: dict[str, str] = {}
    size = 0
    for index in range(shards):
        if index < layers:
            prefix = f"model.layers.{index}."
            tensors = {
                prefix + "self_attn.q_proj.weight": random(hidden, hidden),
                prefix + "self_attn.k_proj.weight": random(hidden, hidden),
                prefix + "self_attn.v_proj.weight": random(hidden, hidden),
                prefix + "self_attn.o_proj.weight": random(hidden, hidden),
                prefix + "mlp.gate_proj.weight": random(intermediate, hidden),
                prefix + "mlp.up_proj.weight": random(intermediate, hidden),
                prefix + "mlp.down_proj.weight": random(hidden, intermediate),
                prefix + "input_layernorm.weight": torch.ones(hidden),
                prefix + "post_attention_layernorm.weight": torch.ones(hidden),
            }
        else:
            tensors = {
                "model.embed_tokens.weight": random(vocab, hidden),
                "model.norm.weight": torch.ones(hidden),
                "lm_head.weight": random(vocab, hidden),
            }
        name = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        size += sum(t.numel() * t.element_size() for t in tensors.values())
    index_file = {"metadata": {"total_size": size}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_file, indent=2))
    return size


def run_child(mode: str, folder: Path, output: Path, limit: int, threads: int, samples: int, seq_len: int) -> dict:
    arguments = [str(limit), mode, str(folder), str(output), str(threads), str(samples), str(seq_len)]
    # glibc keeps address space it freed (per-thread arenas, a heap grown past large frees): two arenas
    # and a fixed mmap threshold make the address space follow what is allocated, so the cap bounds memory.
    environment = {**os.environ, "MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"}
    completed = subprocess.run(
        [sys.executable, "-c", _CHILD, *arguments], capture_output=True, text=True, check=False, env=environment
    )
    lines = completed.stdout.strip().splitlines()
    if not lines:
        return {"ok": False, "error": completed.stderr.strip().splitlines()[-1:] or ["crashed"], "peak_rss": 0}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8, help="calibration samples")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per calibration sample")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--budget",
        type=float,
        default=0.5,
        help="address space allowed beyond torch's own, as a share of the checkpoint",
    )
    parser.add_argument("--compare", action="store_true", help="also try from_pretrained under the same cap")
    parser.add_argument("--folder", type=Path, help="where to write the checkpoint (default: a temporary folder)")
    args = parser.parse_args()

    work = args.folder or Path(tempfile.mkdtemp(prefix="prunereg-streaming-"))
    try:
        start = time.perf_counter()
        index = work / "dense" / "model.safetensors.index.json"
        if args.folder is not None and index.is_file():  # a checkpoint written by an earlier run
            size = json.loads(index.read_text())["metadata"]["total_size"]
            how = "reused"
        else:
            size = write_checkpoint(
                work / "dense", layers=args.layers, hidden=args.hidden, intermediate=args.intermediate,
                vocab=args.vocab, heads=args.heads,
            )  # fmt: skip
            how = f"{time.perf_counter() - start:.0f} s to write"
        shutil.rmtree(work / "pruned", ignore_errors=True)
        shards = len(set(json.loads(index.read_text())["weight_map"].values()))
        print(f"checkpoint: {size / GB:.2f} GB of float32 weights in {shards} shards ({how})")
        budget = int(args.budget * size)
        print(f"each run may map {budget / GB:.2f} GB beyond what the process had after importing torch and prunereg")
        streamed = run_child(
            "stream", work / "dense", work / "pruned", budget, args.threads, args.samples, args.seq_len
        )
        rows = [("prunereg.oneshot_folder, wanda 50 %", streamed)]
        if args.compare:
            rows.append(("from_pretrained (in memory)", run_child("load", work / "dense", work / "x", budget, 1, 0, 0)))
        print()
        print("| run | result | peak RSS | share of checkpoint | time |")
        print("| --- | --- | --- | --- | --- |")
        for label, result in rows:
            outcome = f"{result['sparsity']:.1%} zeros" if result.get("sparsity") is not None else (
                "loaded" if result["ok"] else result["error"])  # fmt: skip
            print(f"| {label} | {outcome} | {result['peak_rss'] / GB:.2f} GB | {result['peak_rss'] / size:.0%} "
                  f"| {result.get('seconds', 0):.0f} s |")  # fmt: skip
        if streamed.get("timings"):
            print("\nstreamed run, seconds by phase:", {k: round(v, 1) for k, v in streamed["timings"].items()})
    finally:
        if args.folder is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
