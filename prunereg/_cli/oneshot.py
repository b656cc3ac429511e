"""``prunereg oneshot``: prune a Hugging Face causal LM folder with a calibrated method and a calibration text.

The model and its tokenizer come from MODEL_DIR (``from_pretrained``), read as
untrusted input (:mod:`prunereg._models.hf_folder`: none of its code runs,
nothing outside it is read, no weight is made up); the calibration text's
first ``--samples`` x ``--seq-len`` tokens become the calibration set, read
and tokenised no further than needed (:mod:`prunereg._oneshot.calibration`).
The pruned model, its config and tokenizer (and with ``--masks`` the masks)
are written to OUTPUT_DIR, which ``from_pretrained`` loads, through
:class:`~prunereg._disk.folder.AtomicFolder`: whole or not at all. Needs the ``hf`` extra (transformers, accelerate).
"""

from __future__ import annotations

import ast
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from prunereg._cli.app import main
from prunereg._disk.signals import cleanup_on_signals
from prunereg._oneshot.precision import MATMUL_PRECISIONS
from prunereg._text import printable

if TYPE_CHECKING:
    from prunereg._disk.folder import AtomicFolder
    from prunereg._oneshot.report import OneShotReport

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
@click.option(
    "--masks",
    is_flag=True,
    help="Also write the masks (prunereg_masks.safetensors), so that prunereg.from_pretrained keeps the pruned "
    "entries at zero through fine-tuning (not with --stream).",
)
@click.option("--force", is_flag=True, help="Replace OUTPUT_DIR if it holds files (in one step, once complete).")
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
    masks: bool,
    force: bool,
    as_json: bool,
) -> None:
    """Prune the causal language model in MODEL_DIR into OUTPUT_DIR, one decoder block at a time.

    MODEL_DIR is untrusted: none of its code runs, no link out of it is
    followed, and weights it lacks or the model does not know are refused.
    OUTPUT_DIR is built beside its place and appears only when complete; one
    that holds files is replaced only with --force.

    \b
    prunereg oneshot ./SmolLM2 ./SmolLM2-wanda --method wanda --calibration text.txt --sparsity 0.5
    prunereg oneshot ./SmolLM2 ./SmolLM2-2-4 -m sparsegpt --calibration text.txt --pattern 2:4 --eval test.txt
    """
    output = _output_folder(output_dir, model_dir, force)
    if stream and dtype != "auto":
        raise click.UsageError("--stream keeps the checkpoint's dtype; leave --dtype out or drop --stream")
    if stream and masks:
        raise click.UsageError("--masks needs the whole model in memory (its masks are kept to the end); drop --stream")
    method_options = _parse_options(options)
    _refuse_oneshot_arguments(method_options)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    except ImportError as error:
        raise click.ClickException(
            "prunereg oneshot needs transformers: pip install -c constraints.txt -e '.[hf]' in prunereg's clone"
        ) from error

    import prunereg
    from prunereg._models.hf_folder import load_causal_lm, load_tokenizer
    from prunereg._oneshot.calibration import CLI_SPELLING, samples_from_text_file
    from prunereg._oneshot.streaming import prune_folder_into

    results = _Results(eval_file.name if eval_file is not None else None)
    with results.shown_on_failure(as_json), _one_line():
        tokenizer = load_tokenizer(model_dir)
        ids = samples_from_text_file(tokenizer, calibration, samples, seq_len, CLI_SPELLING)
        eval_ids = _eval_ids(tokenizer, eval_file, eval_tokens) if eval_file is not None else None
        arguments: dict[str, Any] = {
            "sparsity": sparsity, "pattern": pattern, "allocation": allocation, "owl_threshold": owl_threshold,
            "owl_lambda": owl_lambda, "batch_size": batch_size, "matmul_precision": matmul_precision,
        }  # fmt: skip

        def load(folder: Path, label: str = "MODEL_DIR") -> Any:
            return load_causal_lm(folder, dtype=_torch_dtype(dtype), label=label)

        with cleanup_on_signals(), output as staging:
            if stream:
                if eval_ids is not None:
                    results.before = prunereg.perplexity(load(model_dir), eval_ids, window=eval_window)
                results.report = prune_folder_into(
                    model_dir, output, staging, method, calibration=ids, blocks=None, progress=None,
                    label="MODEL_DIR", options={**arguments, "layers": None, "method_options": method_options},
                )  # fmt: skip
                if eval_ids is not None:
                    results.after = prunereg.perplexity(load(staging, "OUTPUT_DIR"), eval_ids, window=eval_window)
            else:
                model = load(model_dir)
                output.require_free_space(_bytes_to_write(model, masks))
                if eval_ids is not None:
                    results.before = prunereg.perplexity(model, eval_ids, window=eval_window)
                with _masks_if(masks):
                    results.report = prunereg.oneshot(
                        model, method, calibration=ids, permanent=not masks, restore_on_error=False,
                        **arguments, **method_options,
                    )  # fmt: skip
                if eval_ids is not None:
                    results.after = prunereg.perplexity(model, eval_ids, window=eval_window)
                if masks:
                    prunereg.save_pretrained(model, staging)
                else:
                    model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
    results.show(as_json)
    if not as_json:
        click.echo(f"wrote {printable(str(output_dir))}")


@dataclass
class _Results:
    """What the command has computed so far: shown at the end, or before the error when a later step fails."""

    eval_name: str | None
    report: OneShotReport | None = None
    before: float | None = None
    after: float | None = None

    def show(self, as_json: bool) -> None:
        if as_json:
            report = self.report.as_dict() if self.report is not None else None
            click.echo(json.dumps({**(report or {}), "perplexity_before": self.before, "perplexity_after": self.after},
                                  indent=2))  # fmt: skip
            return
        if self.report is not None:
            click.echo(str(self.report))
        if self.before is not None:
            after = f", {self.after:.2f} after" if self.after is not None else ""
            click.echo(f"perplexity on {printable(self.eval_name or '')}: {self.before:.2f} before{after}")

    @contextlib.contextmanager
    def shown_on_failure(self, as_json: bool) -> Iterator[None]:
        """Show what was computed before an error (or Ctrl-C) ends the command."""
        try:
            yield
        except BaseException:
            if self.report is not None or self.before is not None:
                self.show(as_json)
            raise


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
    try:
        yield
    except (ValueError, TypeError, LookupError, OSError) as error:
        raise click.ClickException(str(error)) from error


def _output_folder(output_dir: Path, model_dir: Path, force: bool) -> AtomicFolder:
    """OUTPUT_DIR's writer, checked before any work: not MODEL_DIR, not holding it, empty unless --force."""
    from prunereg._disk.folder import AtomicFolder

    folder = AtomicFolder(output_dir, replace=force, keep={"MODEL_DIR": model_dir})
    try:
        folder.check()
    except OSError as error:
        raise click.ClickException(str(error)) from error
    return folder


def _refuse_oneshot_arguments(method_options: dict[str, Any]) -> None:
    """``-o`` passes the method's own options; oneshot's arguments (``sparsity``, ``permanent``) have their flags."""
    import inspect

    from prunereg._oneshot.engine import oneshot

    own = [name for name in inspect.signature(oneshot).parameters if name not in ("model", "method", "method_options")]
    flags = {param.name: param.opts[0] for param in click.get_current_context().command.params}
    for key in method_options:
        if key == "permanent":
            raise click.UsageError(
                "-o permanent: the command writes plain pruned weights; add --masks to keep the pruning through "
                "fine-tuning"
            )
        if key in own:
            where = f"give it as {flags[key]}" if key in flags else "the command sets it"
            raise click.UsageError(f"-o {key}: {key} is oneshot's own setting, not the method's; {where}")


def _bytes_to_write(model: Any, masks: bool) -> int:
    """About what OUTPUT_DIR will take: the model's weights, and one byte per weight for the masks."""
    parameters = {id(p): p for p in model.parameters()}.values()
    total = sum(p.numel() * p.element_size() for p in parameters)
    return total + (sum(p.numel() for p in parameters) if masks else 0)


@contextlib.contextmanager
def _masks_if(wanted: bool) -> Iterator[None]:
    """With --masks, keep the masks as bool (a byte per weight) instead of in the weights' dtype."""
    if not wanted:
        yield
        return
    import prunereg

    with prunereg.compact_masks():
        yield


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


def _eval_ids(tokenizer: Any, path: Path, limit: int | None) -> Any:
    """The evaluation text's first ``--eval-tokens`` tokens (all without it), read no further than needed."""
    from prunereg._oneshot.calibration import text_file_ids

    tokens = text_file_ids(tokenizer, path, limit)
    if tokens.numel() < 2:
        raise click.ClickException(f"{path} has fewer than 2 tokens to evaluate on")
    return tokens
