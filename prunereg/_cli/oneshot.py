"""``prunereg oneshot``: prune a Hugging Face causal LM folder with a calibrated method and a calibration text.

The model and its tokenizer come from MODEL_DIR (``from_pretrained``); the
calibration text is tokenised whole and its first ``--samples`` x ``--seq-len``
tokens become the calibration set. The pruned model, its config and tokenizer
are written to OUTPUT_DIR, which ``from_pretrained`` loads. Needs the ``hf``
extra (transformers, accelerate).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import click

from prunereg._cli.app import main
from prunereg._oneshot.precision import MATMUL_PRECISIONS
from prunereg._progress import library_bars

_DTYPES = ("auto", "float32", "bfloat16", "float16")


@main.command("oneshot")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("output_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--method", "-m", required=True, help="A calibrated method: wanda, sparsegpt, magnitude (prunereg list).")
@click.option(
    "--calibration",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Text file whose first tokens calibrate the method.",
)
@click.option("--sparsity", type=float, help="Share of each layer's weights to prune [default: 0.5, or N/M].")
@click.option("--pattern", help="N:M pattern, e.g. 2:4 (N zeros in every M consecutive inputs of a row).")
@click.option("--allocation", type=click.Choice(["uniform", "owl"]), default="uniform", show_default=True)
@click.option("--owl-threshold", type=float, default=5.0, show_default=True, help="OWL's outlier threshold M.")
@click.option("--owl-lambda", type=float, default=0.08, show_default=True, help="OWL's sparsity range lambda.")
@click.option("--samples", type=click.IntRange(min=1), default=64, show_default=True, help="Calibration samples.")
@click.option("--seq-len", type=click.IntRange(min=2), default=256, show_default=True, help="Tokens per sample.")
@click.option("--batch-size", type=click.IntRange(min=1), default=2, show_default=True, help="Samples per forward.")
@click.option(
    "--matmul-precision",
    type=click.Choice(MATMUL_PRECISIONS),
    default="medium",
    show_default=True,
    help="float32 matmul precision of the calibration forwards; statistics and pruning always run in full float32.",
)
@click.option(
    "--option",
    "-o",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="A method option, e.g. -o blocksize=64 (repeatable; see prunereg info METHOD).",
)
@click.option(
    "--dtype",
    type=click.Choice(_DTYPES),
    default="auto",
    show_default=True,
    help="Load the model as (not with --stream).",
)
@click.option(
    "--stream",
    is_flag=True,
    help="Read one block at a time from MODEL_DIR's safetensors files (models larger than memory).",
)
@click.option(
    "--eval",
    "eval_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Text file: print perplexity before and after (loads the whole model, also with --stream).",
)
@click.option("--eval-window", type=click.IntRange(min=2), default=512, show_default=True)
@click.option("--eval-tokens", type=click.IntRange(min=2), help="Evaluate only the first N tokens of --eval.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def oneshot_command(
    model_dir: Path,
    output_dir: Path,
    method: str,
    calibration: Path,
    sparsity: float | None,
    pattern: str | None,
    allocation: str,
    owl_threshold: float,
    owl_lambda: float,
    samples: int,
    seq_len: int,
    batch_size: int,
    matmul_precision: str,
    options: tuple[str, ...],
    dtype: str,
    stream: bool,
    eval_file: Path | None,
    eval_window: int,
    eval_tokens: int | None,
    as_json: bool,
) -> None:
    """Prune the causal language model in MODEL_DIR into OUTPUT_DIR, one decoder block at a time.

    \b
    prunereg oneshot ./SmolLM2 ./SmolLM2-wanda --method wanda --calibration text.txt --sparsity 0.5
    prunereg oneshot ./SmolLM2 ./SmolLM2-2-4 -m sparsegpt --calibration text.txt --pattern 2:4 --eval test.txt
    """
    if output_dir.exists() and any(output_dir.iterdir()):
        raise click.ClickException(f"{output_dir} already exists and is not empty; name another OUTPUT_DIR")
    if stream and dtype != "auto":
        raise click.UsageError("--stream keeps the checkpoint's dtype; leave --dtype out or drop --stream")
    method_options = _parse_options(options)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as error:
        raise click.ClickException(
            "prunereg oneshot needs transformers: pip install -c constraints.txt -e '.[hf]' in prunereg's clone"
        ) from error

    import prunereg

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = _calibration_ids(tokenizer, calibration, samples, seq_len)
    eval_ids = _eval_ids(tokenizer, eval_file, eval_tokens) if eval_file is not None else None
    arguments: dict[str, Any] = {
        "calibration": ids, "sparsity": sparsity, "pattern": pattern, "allocation": allocation,
        "owl_threshold": owl_threshold, "owl_lambda": owl_lambda, "batch_size": batch_size,
        "matmul_precision": matmul_precision, **method_options,
    }  # fmt: skip

    def load(folder: Path) -> Any:
        with library_bars():  # transformers' bar for the weights stays out of log files
            return AutoModelForCausalLM.from_pretrained(folder, dtype=_torch_dtype(dtype)).eval()

    before = after = None
    try:
        if stream:
            if eval_ids is not None:
                before = prunereg.perplexity(load(model_dir), eval_ids, window=eval_window)
            report = prunereg.oneshot_folder(model_dir, output_dir, method, **arguments)
            if eval_ids is not None:
                after = prunereg.perplexity(load(output_dir), eval_ids, window=eval_window)
        else:
            model = load(model_dir)
            if eval_ids is not None:
                before = prunereg.perplexity(model, eval_ids, window=eval_window)
            report = prunereg.oneshot(model, method, **arguments)
            if eval_ids is not None:
                after = prunereg.perplexity(model, eval_ids, window=eval_window)
            model.save_pretrained(output_dir)
    except (ValueError, TypeError, LookupError, OSError) as error:
        raise click.ClickException(str(error)) from error
    tokenizer.save_pretrained(output_dir)
    if as_json:
        click.echo(json.dumps({**report.as_dict(), "perplexity_before": before, "perplexity_after": after}, indent=2))
        return
    click.echo(str(report))
    if before is not None:
        click.echo(f"perplexity on {eval_file.name}: {before:.2f} before, {after:.2f} after")  # type: ignore[union-attr]
    click.echo(f"wrote {output_dir}")


def _torch_dtype(name: str) -> Any:
    import torch

    return name if name == "auto" else getattr(torch, name)


def _parse_options(options: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a value is a Python literal (64, 0.01, True) or else a string."""
    parsed = {}
    for option in options:
        key, sep, text = option.partition("=")
        if not sep or not key.isidentifier():
            raise click.BadParameter(f"{option!r} is not KEY=VALUE", param_hint="--option")
        try:
            parsed[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            parsed[key] = text
    return parsed


def _token_ids(tokenizer: Any, path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    return tokenizer(text, return_tensors="pt").input_ids[0]


def _calibration_ids(tokenizer: Any, path: Path, samples: int, seq_len: int) -> Any:
    """The text's first ``samples * seq_len`` tokens as ``[samples, seq_len]``."""
    tokens = _token_ids(tokenizer, path)
    needed = samples * seq_len
    if tokens.numel() < needed:
        raise click.ClickException(
            f"{path} has {tokens.numel()} tokens; --samples {samples} x --seq-len {seq_len} needs {needed}"
        )
    return tokens[:needed].reshape(samples, seq_len)


def _eval_ids(tokenizer: Any, path: Path, limit: int | None) -> Any:
    tokens = _token_ids(tokenizer, path)
    if tokens.numel() < 2:
        raise click.ClickException(f"{path} has fewer than 2 tokens to evaluate on")
    return tokens[:limit] if limit is not None else tokens
