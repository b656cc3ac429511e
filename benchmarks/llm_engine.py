"""The one-shot engine against the reference implementations' loop, on the same machine at the same time.

    python benchmarks/llm_engine.py                # 4 SmolLM2-135M-shaped blocks, 64 x 256 tokens, 2 threads
    python benchmarks/llm_engine.py --blocks 30 --repeats 1

The Wanda and SparseGPT reference code prunes block by block as prunereg does,
but runs the calibration samples through each block one at a time and gathers
statistics per Linear layer (q, k and v each their own, though they read one
input). This script writes that loop out (per-sample forwards, one forward hook
per layer, running means of the squared input norms or of ``2 x x^T``; Wanda's
stable sort per row, or SparseGPT's column sweep per layer as the paper gives
it) and times it against ``prunereg.oneshot`` on copies of one random model,
alternating them: the engine at ``matmul_precision="highest"`` (all float32) and
at its default ``"medium"`` (bfloat16 products in the calibration forwards,
where the hardware has them). The share of masks that agree with the loop's is
reported: batching and summation order flip a few near-ties, and SparseGPT's
reference prunes one weight more per column block (its threshold is ``<=`` the
k-th smallest). ``tests/project/test_llm_engine_benchmark.py`` holds the loops to the
engine on a tiny model, where Wanda's masks are equal.
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


def reference_style_loop(model: nn.Module, ids: torch.Tensor, prune_layer: Any, needs: str) -> None:
    """The reference loop: one sample at a time through each block, statistics per Linear layer.

    ``needs`` is ``"norms"`` (Wanda's running mean of squared input norms) or
    ``"hessian"`` (SparseGPT's running mean of ``2 x x^T``); ``prune_layer(layer, statistic)``
    prunes one layer in place.
    """
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
            shapes = {
                name: (m.in_features,) if needs == "norms" else (m.in_features,) * 2 for name, m in linears.items()
            }
            statistics = {name: torch.zeros(shape) for name, shape in shapes.items()}
            seen = dict.fromkeys(linears, 0)

            def record(name: str, statistics: dict[str, torch.Tensor] = statistics, seen: dict[str, int] = seen) -> Any:
                def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
                    x = args[0].reshape(-1, args[0].shape[-1]).t().float()
                    statistics[name] *= seen[name] / (seen[name] + x.shape[1])
                    seen[name] += x.shape[1]
                    if needs == "norms":
                        statistics[name] += torch.norm(x, p=2, dim=1) ** 2 / seen[name]
                    else:
                        x = x * (2 / seen[name]) ** 0.5
                        statistics[name] += x @ x.t()

                return hook

            handles = [m.register_forward_hook(record(name)) for name, m in linears.items()]
            for hidden, kwargs in zip(inputs, arguments, strict=True):
                block(hidden, **kwargs)
            for handle in handles:
                handle.remove()
            for name, layer in linears.items():
                prune_layer(layer, statistics[name])
            inputs = [block(hidden, **kwargs) for hidden, kwargs in zip(inputs, arguments, strict=True)]


def wanda_layer(layer: nn.Linear, norms: torch.Tensor, sparsity: float = 0.5) -> None:
    """Wanda on one layer: per row, the lowest ``|W| * sqrt(norms)`` by a stable sort."""
    metric = layer.weight.abs() * norms.sqrt()
    lowest = torch.sort(metric, dim=-1, stable=True)[1][:, : int(layer.in_features * sparsity)]
    layer.weight[torch.zeros_like(metric, dtype=torch.bool).scatter_(1, lowest, True)] = 0


def sparsegpt_layer(layer: nn.Linear, hessian: torch.Tensor, sparsity: float = 0.5, blocksize: int = 128) -> None:
    """SparseGPT on one layer, as the paper's algorithm: inverse Hessian's Cholesky factor, column sweep.

    The weight is swept transposed (a column of ``W`` is a contiguous row), the layout a
    CPU needs; the references index ``W[:, i]`` directly, which is fast on a GPU only.
    """
    columns = layer.weight.t().float().contiguous()  # [in, out]
    n_inputs = columns.shape[0]
    dead = hessian.diagonal() == 0
    hessian[dead, dead] = 1
    columns[dead] = 0
    hessian += 0.01 * hessian.diagonal().mean() * torch.eye(n_inputs)
    factor = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hessian)), upper=True)
    for start in range(0, n_inputs, blocksize):
        end = min(start + blocksize, n_inputs)
        block, block_factor = columns[start:end], factor[start:end, start:end]
        errors = torch.zeros_like(block)
        saliency = block**2 / block_factor.diagonal().reshape(-1, 1) ** 2
        pruned = saliency <= torch.sort(saliency.flatten())[0][int(saliency.numel() * sparsity)]
        for i in range(end - start):
            errors[i] = block[i] * pruned[i] / block_factor[i, i]
            block[i:].addmm_(block_factor[i, i:, None], errors[i, None], alpha=-1)
            block[i].masked_fill_(pruned[i], 0)
        columns[end:].addmm_(factor[start:end, end:].t(), errors, alpha=-1)
    layer.weight.copy_(columns.t())


REFERENCES = {"wanda": (wanda_layer, "norms"), "sparsegpt": (sparsegpt_layer, "hessian")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--method", choices=sorted(REFERENCES), default="wanda")
    args = parser.parse_args()

    import prunereg

    torch.set_num_threads(args.threads)
    dense = smollm2_shaped(args.blocks)
    ids = torch.randint(0, 49152, (args.samples, args.seq_len), generator=torch.Generator().manual_seed(1))
    print(
        f"| {args.method}, run | reference-style loop | oneshot, highest | ratio | masks agreeing "
        "| oneshot, medium (default) | ratio | masks agreeing |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in range(1, args.repeats + 1):
        reference = copy.deepcopy(dense)
        start = time.perf_counter()
        reference_style_loop(reference, ids, *REFERENCES[args.method])
        reference_seconds = time.perf_counter() - start
        cells = [f"{reference_seconds:.1f} s"]
        for precision in ("highest", "medium"):
            engine = copy.deepcopy(dense)
            start = time.perf_counter()
            prunereg.oneshot(
                engine, args.method, calibration=ids, sparsity=0.5, matmul_precision=precision, progress=False
            )
            seconds = time.perf_counter() - start
            pairs = [(a, b) for (name, a), b in zip(reference.named_parameters(), engine.parameters(), strict=True)
                     if name.startswith("model.layers.") and name.endswith("_proj.weight")]  # fmt: skip
            agreeing = sum(int(((a == 0) == (b == 0)).sum()) for a, b in pairs) / sum(a.numel() for a, _ in pairs)
            cells += [f"{seconds:.1f} s", f"{seconds / reference_seconds:.2f}"]
            cells.append(f"{agreeing:.4%}")
        print(f"| {run} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
