"""The one-shot engine against the reference implementations' loop, on the same machine at the same time.

    python benchmarks/llm_engine.py                # 4 SmolLM2-135M-shaped blocks, 64 x 256 tokens, 2 threads
    python benchmarks/llm_engine.py --blocks 30 --repeats 1

The Wanda and SparseGPT reference code prunes block by block as prunereg does,
but runs the calibration samples through each block one at a time and gathers
statistics per Linear layer (q, k and v each their own, though they read one
input). This script writes that loop out for Wanda (per-sample forwards, one
forward hook per layer, the running mean of squared input norms, a stable sort
per row), times it against ``prunereg.oneshot(model, "wanda")`` on copies of one
random model, alternating the two, and checks that both prune the same weights.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import time
from typing import Any

import torch
from torch import nn


def smollm2_shaped(blocks: int) -> nn.Module:
    """A random model with SmolLM2-135M's shapes (hidden 576, 9 heads, 3 key/value heads, MLP 1536)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=blocks, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


class _Stop(Exception):
    pass


def reference_style_wanda(model: nn.Module, ids: torch.Tensor, sparsity: float) -> None:
    """Wanda as the reference loop runs it: one sample at a time, statistics per layer."""
    layers = model.model.layers
    inputs: list[torch.Tensor] = []
    arguments: list[dict[str, Any]] = []

    def catch(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        inputs.append(args[0])
        arguments.append(kwargs)
        raise _Stop

    with torch.no_grad():
        handle = layers[0].register_forward_pre_hook(catch, with_kwargs=True)
        for sample in ids:
            with contextlib.suppress(_Stop):
                model(sample[None], use_cache=False)
        handle.remove()
        for block in layers:
            linears = {name: m for name, m in block.named_modules() if isinstance(m, nn.Linear)}
            norms = {name: torch.zeros(m.in_features) for name, m in linears.items()}
            seen = dict.fromkeys(linears, 0)

            def record(name: str, norms: dict[str, torch.Tensor] = norms, seen: dict[str, int] = seen) -> Any:
                def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
                    x = args[0].reshape(-1, args[0].shape[-1]).t().float()
                    norms[name] *= seen[name] / (seen[name] + x.shape[1])
                    seen[name] += x.shape[1]
                    norms[name] += torch.norm(x, p=2, dim=1) ** 2 / seen[name]

                return hook

            handles = [m.register_forward_hook(record(name)) for name, m in linears.items()]
            for hidden, kwargs in zip(inputs, arguments, strict=True):
                block(hidden, **kwargs)
            for handle in handles:
                handle.remove()
            for name, layer in linears.items():
                metric = layer.weight.abs() * norms[name].sqrt()
                lowest = torch.sort(metric, dim=-1, stable=True)[1][:, : int(layer.in_features * sparsity)]
                layer.weight[torch.zeros_like(metric, dtype=torch.bool).scatter_(1, lowest, True)] = 0
            inputs = [block(hidden, **kwargs) for hidden, kwargs in zip(inputs, arguments, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import prunereg

    torch.set_num_threads(args.threads)
    dense = smollm2_shaped(args.blocks)
    ids = torch.randint(0, 49152, (args.samples, args.seq_len), generator=torch.Generator().manual_seed(1))
    print(
        "| run | reference-style loop | prunereg.oneshot | ratio | same masks "
        "| oneshot: forwards / statistics / pruning |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for run in range(1, args.repeats + 1):
        reference = copy.deepcopy(dense)
        start = time.perf_counter()
        reference_style_wanda(reference, ids, 0.5)
        reference_seconds = time.perf_counter() - start
        engine = copy.deepcopy(dense)
        start = time.perf_counter()
        report = prunereg.oneshot(engine, "wanda", calibration=ids, sparsity=0.5, progress=False)
        engine_seconds = time.perf_counter() - start
        same = all(
            torch.equal(a == 0, b == 0) for a, b in zip(reference.parameters(), engine.parameters(), strict=True)
        )
        t = report.timings
        print(
            f"| {run} | {reference_seconds:.1f} s | {engine_seconds:.1f} s | {engine_seconds / reference_seconds:.2f} "
            f"| {'yes' if same else 'no'} | {t.forward:.1f} / {t.statistics:.1f} / {t.pruning:.1f} s |"
        )


if __name__ == "__main__":
    main()
