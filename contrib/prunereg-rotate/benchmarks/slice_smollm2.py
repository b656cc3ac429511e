"""Perplexity of a Llama-style model after ``rotate``, sliced to several widths (the README's SmolLM2 figures).

    python contrib/prunereg-rotate/benchmarks/slice_smollm2.py               # SmolLM2-135M from prunereg's cache
    python .../slice_smollm2.py --model DIR --tokens FILE --widths 576 512 448

``--tokens`` is a safetensors file with a calibration text and an evaluation
text as token ids (prunereg's llm-eval cache has Coriolanus and Hamlet from
tokenizing Shakespeare with SmolLM2's tokenizer, ``benchmarks/llm.py``).
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
from prunereg_rotate import rotate
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import prunereg

CACHE = Path.home() / ".cache" / "prunereg" / "llm-eval"


def main(argv: list[str] | None = None) -> list[tuple[int, float, float]]:
    """Print and return ``(width, kept share, perplexity)`` for the dense model (its width) and each slice."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=CACHE / "smollm2-135m")
    parser.add_argument("--tokens", type=Path, default=CACHE / "tokens.safetensors")
    parser.add_argument("--calibration", default="coriolanus", help="the calibration text's key in --tokens")
    parser.add_argument("--evaluation", default="hamlet", help="the evaluation text's key in --tokens")
    parser.add_argument("--samples", type=int, default=16, help="calibration rows used")
    parser.add_argument("--widths", type=int, nargs="+", default=[576, 512, 448])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dense = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    texts = load_file(args.tokens)
    calibration, evaluation = texts[args.calibration][: args.samples], texts[args.evaluation]
    rows = [(dense.config.hidden_size, 1.0, prunereg.perplexity(dense, evaluation))]
    print(f"dense: hidden size {rows[0][0]}, perplexity {rows[0][2]:.2f}", flush=True)
    for width in args.widths:
        model = copy.deepcopy(dense)
        start = time.perf_counter()
        report = rotate(model, calibration, hidden_size=width, batch_size=4)
        seconds = time.perf_counter() - start
        rows.append((width, report.kept_energy, prunereg.perplexity(model, evaluation)))
        print(f"{report}; perplexity {rows[-1][2]:.2f} (rotation {seconds:.0f} s)", flush=True)
    return rows


if __name__ == "__main__":
    main()
