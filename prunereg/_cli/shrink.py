"""``prunereg shrink``: make a Hugging Face causal LM folder smaller, its parts removed by a shrink method.

The safeties are ``prunereg oneshot``'s, through the same helpers: MODEL_DIR is
read as untrusted input (:mod:`prunereg._models.hf_folder`), the calibration
text is tokenised the same way, and OUTPUT_DIR is written through
:class:`~prunereg._disk.folder.AtomicFolder` inside the signal clean-up: whole
or not at all, never over MODEL_DIR, replaced only with ``--force``. The output
loads with stock ``transformers``.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from prunereg._cli.app import main
from prunereg._cli.oneshot import (
    _DTYPES,
    _bytes_to_write,
    _eval_ids,
    _output_folder,
    _torch_dtype,
)
from prunereg._cli.values import key_values
from prunereg._disk.signals import cleanup_on_signals
from prunereg._oneshot.precision import MATMUL_PRECISIONS
from prunereg._text import printable

if TYPE_CHECKING:
    from prunereg._shrink.report import ShrinkReport


@main.command("shrink")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("output_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--method",
    "-m",
    required=True,
    help="A shrink method: flap, wanda_sp, magnitude_sp, block_influence, reap (prunereg list --kind shrink).",
)
@click.option("--mlp", type=float, default=0.0, show_default=True, help="Share of each MLP's channels removed.")
@click.option(
    "--heads", type=float, default=0.0, show_default=True, help="Share of each attention's KV groups removed."
)
@click.option("--layers", type=click.IntRange(min=0), default=0, show_default=True, help="Decoder blocks removed.")
@click.option(
    "--experts", type=float, default=0.0, show_default=True, help="Share of each MoE layer's experts removed."
)
@click.option(
    "--calibration",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Text file whose first tokens calibrate the method (every method but magnitude_sp needs one).",
)
@click.option("--samples", type=click.IntRange(min=1), default=64, show_default=True, help="Calibration samples.")
@click.option("--seq-len", type=click.IntRange(min=2), default=256, show_default=True, help="Tokens per sample.")
@click.option("--batch-size", type=click.IntRange(min=1), default=2, show_default=True, help="Samples per forward.")
@click.option(
    "--matmul-precision",
    type=click.Choice(MATMUL_PRECISIONS),
    default="medium",
    show_default=True,
    help="float32 matmul precision of the calibration forwards; statistics and scores always run in full float32.",
)
@click.option(
    "--option",
    "-o",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    callback=key_values,
    help="A method option, e.g. -o compensate=False (repeatable; see prunereg info METHOD). Values as prune --arg's.",
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
    help="Text file: print perplexity before and after.",
)
@click.option("--eval-window", type=click.IntRange(min=2), default=512, show_default=True)
@click.option("--eval-tokens", type=click.IntRange(min=2), help="Evaluate only the first N tokens of --eval.")
@click.option("--force", is_flag=True, help="Replace OUTPUT_DIR if it holds files (in one step, once complete).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def shrink_command(
    model_dir: Path,
    output_dir: Path,
    method: str,
    mlp: float,
    heads: float,
    layers: int,
    experts: float,
    calibration: Path | None,
    samples: int,
    seq_len: int,
    batch_size: int,
    matmul_precision: str,
    options: dict[str, Any],
    dtype: str,
    stream: bool,
    eval_file: Path | None,
    eval_window: int,
    eval_tokens: int | None,
    force: bool,
    as_json: bool,
) -> None:
    """Shrink the causal language model in MODEL_DIR into OUTPUT_DIR: fewer channels, heads, blocks or experts.

    The config in OUTPUT_DIR states the new sizes, so stock transformers loads
    it. MODEL_DIR is untrusted: none of its code runs, no link out of it is
    followed. OUTPUT_DIR appears only when complete; one that holds files is
    replaced only with --force.

    \b
    prunereg shrink ./SmolLM2 ./SmolLM2-flap -m flap --mlp 0.5 --heads 0.34 --calibration text.txt
    prunereg shrink ./SmolLM2 ./SmolLM2-short -m block_influence --layers 6 --calibration text.txt --eval test.txt
    """
    output = _output_folder(output_dir, model_dir, force)
    if stream and dtype != "auto":
        raise click.UsageError("--stream keeps the checkpoint's dtype; leave --dtype out or drop --stream")
    method_options = dict(options)
    _refuse_shrink_arguments(method_options)
    try:
        from transformers import AutoModelForCausalLM  # noqa: F401
    except ImportError as error:
        raise click.ClickException(
            "prunereg shrink needs transformers: pip install -c constraints.txt -e '.[hf]' in prunereg's clone"
        ) from error

    import prunereg
    from prunereg._models.hf_folder import load_causal_lm, load_tokenizer
    from prunereg._oneshot.calibration import CLI_SPELLING, samples_from_text_file
    from prunereg._shrink.streaming import shrink_folder_into

    report: ShrinkReport | None = None
    before = after = None
    tokenizer = load_tokenizer(model_dir)
    ids = None
    if calibration is not None:
        ids = samples_from_text_file(tokenizer, calibration, samples, seq_len, CLI_SPELLING)
    eval_ids = _eval_ids(tokenizer, eval_file, eval_tokens) if eval_file is not None else None
    arguments: dict[str, Any] = {
        "mlp": mlp, "heads": heads, "layers": layers, "experts": experts, "batch_size": batch_size,
        "matmul_precision": matmul_precision,
    }  # fmt: skip

    def load(folder: Path, label: str = "MODEL_DIR") -> Any:
        return load_causal_lm(folder, dtype=_torch_dtype(dtype), label=label)

    with cleanup_on_signals(), output as staging:
        if stream:
            if eval_ids is not None:
                before = prunereg.perplexity(load(model_dir), eval_ids, window=eval_window)
            report = shrink_folder_into(
                model_dir, output, staging, method, ids, blocks=None, progress=None, label="MODEL_DIR",
                options={**arguments, "method_options": method_options},
            )  # fmt: skip
            if eval_ids is not None:
                after = prunereg.perplexity(load(staging, "OUTPUT_DIR"), eval_ids, window=eval_window)
        else:
            model = load(model_dir)
            output.require_free_space(_bytes_to_write(model, False))
            if eval_ids is not None:
                before = prunereg.perplexity(model, eval_ids, window=eval_window)
            # A failure discards the model and OUTPUT_DIR both: nothing to put back.
            report = prunereg.shrink(model, method, ids, restore_on_error=False, **arguments, **method_options)
            if eval_ids is not None:
                after = prunereg.perplexity(model, eval_ids, window=eval_window)
            model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    if as_json:
        click.echo(json.dumps({**report.as_dict(), "perplexity_before": before, "perplexity_after": after}, indent=2))
        return
    click.echo(str(report))
    if before is not None and eval_file is not None:
        click.echo(f"perplexity on {printable(eval_file.name)}: {before:.2f} before, {after:.2f} after")
    click.echo(f"wrote {printable(str(output_dir))}")


def _refuse_shrink_arguments(method_options: dict[str, Any]) -> None:
    """``-o`` passes the method's own options; shrink's arguments have their flags."""
    from prunereg._shrink.engine import shrink

    own = [name for name in inspect.signature(shrink).parameters if name not in ("model", "method", "method_options")]
    flags = {param.name: param.opts[0] for param in click.get_current_context().command.params}
    for key in method_options:
        if key in own:
            where = f"give it as {flags[key]}" if key in flags else "the command sets it"
            raise click.UsageError(f"-o {key}: {key} is shrink's own setting, not the method's; {where}")
