"""Peak memory of ``prunereg.slim(model, x, ratio=0.5)`` on a Llama-shaped bfloat16 model, against its weights' bytes.

    python benchmarks/slim_memory.py                     # Llama-3.2-1B's shape (2.3 GiB of weights)
    python benchmarks/slim_memory.py --layers 2 --hidden 256 --intermediate 1024 --heads 8 --kv-heads 2

The model is built from a ``LlamaConfig`` with random weights, straight in
bfloat16. The process's resident size is read before the model is built, and
its peak (``VmHWM``, restarted just before ``slim``) while slimming:
``peak_over_weights`` is ``(peak - before) / weights' bytes``, 1.0 the model
alone and slimming free; ``slimming_over_weights`` is what slimming added above
the loaded model (``(peak - with the model) / weights' bytes``), which leaves out
what building the model cost beyond its weights (the allocator's slack). Prints
one JSON object. Run it in a process of its own (the peak is the whole
process's), on a machine with a few GiB to spare.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from memory import peak, reset_peak, rss, trim  # noqa: E402  (benchmarks/memory.py)

import prunereg  # noqa: E402

LLAMA_3_2_1B = {"layers": 16, "hidden": 2048, "intermediate": 8192, "heads": 32, "kv_heads": 8, "vocab": 128256}
"""Llama-3.2-1B's shape (its embedding tied to the head, as there)."""


def build(layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int, vocab: int) -> nn.Module:
    """A randomly initialised Llama of this shape, in bfloat16 from the start (never a float32 copy)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=256,
    )  # fmt: skip
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers, a tied tensor counted once."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def measure(shape: dict[str, int], ratio: float = 0.5) -> dict[str, float]:
    """Slim a model of ``shape`` at ``ratio`` in this process: its weights, the peak above the start, CPU seconds."""
    warm = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    prunereg.slim(warm, torch.randn(1, 4), ratio=ratio)  # torch.export's imports and first-call costs, not counted
    gc.collect()
    trim()
    before = rss()
    model = build(**shape)
    weights = weight_bytes(model)
    example = torch.randint(1, shape["vocab"], (1, 8))
    gc.collect()
    trim()
    loaded = rss()
    if not reset_peak():
        raise SystemExit("this kernel cannot restart the peak resident size (/proc/self/clear_refs): Linux only")
    start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = prunereg.slim(model, example, ratio=ratio)
    seconds = time.process_time() - start
    top = peak()
    return {
        "weights_bytes": weights,
        "rss_before_bytes": before,
        "rss_with_model_bytes": loaded,
        "peak_bytes": top,
        "peak_over_weights": round((top - before) / weights, 3),
        "slimming_over_weights": round((top - loaded) / weights, 3),
        "params_before": report.params_before,
        "params_after": report.params_after,
        "cpu_seconds": round(seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in LLAMA_3_2_1B.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    parser.add_argument("--ratio", type=float, default=0.5)
    options = vars(parser.parse_args())
    ratio = options.pop("ratio")
    print(json.dumps({"shape": options, "ratio": ratio, **measure(options, ratio)}))


if __name__ == "__main__":
    main()
