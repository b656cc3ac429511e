"""``prunereg oneshot``: prune a Hugging Face causal LM folder with a calibrated method and a calibration text.

The model and its tokenizer come from MODEL_DIR (``from_pretrained``), read as
untrusted input (:mod:`prunereg._models.hf_folder`: none of its code runs,
nothing outside it is read, no weight is made up); the calibration text's
first ``--samples`` x ``--seq-len`` tokens become the calibration set, read
and tokenised no further than needed (:mod:`prunereg._runtime.calibration`).
The pruned model, its config and tokenizer (and with ``--masks`` the masks)
are written to OUTPUT_DIR, which ``from_pretrained`` loads, through
:class:`~prunereg._disk.folder.AtomicFolder`: whole or not at all. Needs the ``hf`` extra (transformers, accelerate).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from prunereg._cli.app import main
from prunereg._cli.errors import EXIT_CODES
from prunereg._cli.shared import (
    Results,
    bytes_to_write,
    calibration_options,
    dtype_option,
    eval_options,
    force_option,
    json_option,
    library_bars_unless,
    output_folder,
    quiet_option,
    read_eval_ids,
    settings_as_options,
    stream_option,
    torch_dtype,
)
from prunereg._cli.values import key_values
from prunereg._disk.signals import cleanup_on_signals
from prunereg._oneshot.settings import OneShotOptions
from prunereg._runtime.options import cli_flag
from prunereg._text import describe, printable

if TYPE_CHECKING:
    pass


@main.command("oneshot", epilog=EXIT_CODES)
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("output_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--method", "-m", required=True, help="A calibrated method: wanda, sparsegpt, magnitude (prunereg list).")
@calibration_options()
@settings_as_options(OneShotOptions)
@click.option(
    "--option",
    "-o",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    callback=key_values,
    help="A method option, e.g. -o blocksize=64 (repeatable; see prunereg info METHOD). Values as prune --arg's.",
)
@click.option(
    "--device",
    metavar="DEVICE",
    help="Where the model runs: cpu, cuda, cuda:1, mps ... [default: where from_pretrained puts it, the CPU].",
)
@dtype_option
@stream_option
@eval_options
@click.option(
    "--masks",
    is_flag=True,
    help="Also write the masks (prunereg_masks.safetensors), so that prunereg.from_pretrained keeps the pruned "
    "entries at zero through fine-tuning (not with --stream).",
)
@force_option
@json_option
@quiet_option
def oneshot_command(
    model_dir: Path,
    output_dir: Path,
    method: str,
    calibration: Path,
    samples: int,
    seq_len: int,
    options: dict[str, Any],
    device: str | None,
    dtype: str,
    stream: bool,
    eval_file: Path | None,
    eval_window: int,
    eval_tokens: int | None,
    masks: bool,
    force: bool,
    as_json: bool,
    quiet: bool,
    **flags: Any,
) -> None:
    """Prune the causal language model in MODEL_DIR into OUTPUT_DIR, one decoder block at a time.

    MODEL_DIR is untrusted: none of its code runs, no link out of it is
    followed, and weights it lacks or the model does not know are refused.
    OUTPUT_DIR is built beside its place and appears only when complete; one
    that holds files is replaced only with --force. Every argument is checked
    before the model loads; any error is one line (--debug: the traceback).

    \b
    prunereg oneshot ./SmolLM2 ./SmolLM2-wanda --method wanda --calibration text.txt --sparsity 0.5
    prunereg oneshot ./SmolLM2 ./SmolLM2-2-4 -m sparsegpt --calibration text.txt --pattern 2:4 --eval test.txt
    """
    if stream and dtype != "auto":
        raise click.UsageError("--stream keeps the checkpoint's dtype; leave --dtype out or drop --stream")
    if stream and masks:
        raise click.UsageError("--masks needs the whole model in memory (its masks are kept to the end); drop --stream")
    _refuse_oneshot_arguments(options)
    settings = _settings(flags, masks, progress=not quiet)
    torch_device = _torch_device(device)
    output = output_folder(output_dir, model_dir, force)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    except ImportError as error:
        raise click.ClickException(
            "prunereg oneshot needs transformers: pip install -c constraints.txt -e '.[hf]' in prunereg's clone"
        ) from error

    import prunereg
    from prunereg._models.hf_folder import load_causal_lm, load_tokenizer
    from prunereg._oneshot.engine import build_method
    from prunereg._oneshot.folder import prune_folder_into
    from prunereg._runtime.calibration import CLI_SPELLING, samples_from_text_file
    from prunereg._runtime.ranks import Ranks, launched_group, together

    build_method(method, settings.sparsity, settings.pattern, options)  # the method and its -o, before any loading
    results = Results(eval_file.name if eval_file is not None else None)
    with launched_group(device), results.shown_on_failure(as_json), library_bars_unless(quiet):
        ranks = Ranks.current(settings.data_parallel)  # under torchrun: rank 0 writes, the others calibrate beside it
        with together(ranks):
            tokenizer = load_tokenizer(model_dir)
            ids = samples_from_text_file(tokenizer, calibration, samples, seq_len, CLI_SPELLING)

            def load(folder: Path, label: str = "MODEL_DIR") -> Any:
                model = load_causal_lm(folder, dtype=torch_dtype(dtype), label=label)
                return model if torch_device is None else model.to(torch_device)

            if ranks is not None and ranks.rank != 0:
                if stream:
                    prune_folder_into(
                        model_dir, None, None, method, calibration=ids, label="MODEL_DIR", options=settings,
                        method_options=options, device=torch_device,
                    )  # fmt: skip
                else:
                    with _masks_if(masks):
                        prunereg.oneshot(
                            load(model_dir), method, calibration=ids, **dataclasses.asdict(settings), **options
                        )
                return
            eval_ids = read_eval_ids(tokenizer, eval_file, eval_tokens) if eval_file is not None else None
            with cleanup_on_signals(), output as staging:
                if stream:
                    results.streamed(
                        lambda: prune_folder_into(
                            model_dir, output, staging, method, calibration=ids, label="MODEL_DIR",
                            options=settings, method_options=options, device=torch_device,
                        ),
                        lambda: load(model_dir), lambda: load(staging, "OUTPUT_DIR"), eval_ids, eval_window, not quiet,
                    )  # fmt: skip
                else:
                    model = load(model_dir)
                    output.require_free_space(bytes_to_write(model, masks))
                    if eval_ids is not None:
                        results.measure("before", model, eval_ids, eval_window, not quiet)
                    with _masks_if(masks):
                        results.report = prunereg.oneshot(
                            model, method, calibration=ids, **dataclasses.asdict(settings), **options
                        )
                    if eval_ids is not None:
                        results.measure("after", model, eval_ids, eval_window, not quiet)
                    if masks:
                        prunereg.save_pretrained(model, staging)
                    else:
                        model.save_pretrained(staging)
                tokenizer.save_pretrained(staging)
    results.show(as_json)
    if not as_json:
        click.echo(f"wrote {printable(str(output_dir))}")


def _refuse_oneshot_arguments(method_options: dict[str, Any]) -> None:
    """``-o`` passes the method's own options; oneshot's settings (``sparsity``, ``permanent``) have their flags."""
    for key in method_options:
        if key == "permanent":
            raise click.UsageError(
                "-o permanent: the command writes plain pruned weights; add --masks to keep the pruning through "
                "fine-tuning"
            )
        if key in OneShotOptions.names():
            flag = cli_flag(key, OneShotOptions.settings()[key][1])
            where = f"give it as {flag}" if flag is not None else "the command sets it"
            raise click.UsageError(f"-o {key}: {key} is oneshot's own setting, not the method's; {where}")


def _settings(flags: dict[str, Any], masks: bool, progress: bool) -> OneShotOptions:
    """The run's settings from their flags; checked here, before anything loads (a bad one: one line, status 2)."""
    given = {name: flags[name] for name in OneShotOptions.names() if name in flags}
    if given.get("layers") == ():  # --layers not given: every layer
        given["layers"] = None
    try:
        return OneShotOptions(**given, permanent=not masks, progress=progress, restore_on_error=False)
    except (TypeError, ValueError) as error:
        raise click.UsageError(_in_flag_words(str(error))) from None


def _in_flag_words(message: str) -> str:
    """A settings error as the command says it: a leading setting name becomes its flag (``--pattern must ...``)."""
    name, space, rest = message.partition(" ")
    setting = OneShotOptions.settings().get(name)
    flag = cli_flag(name, setting[1]) if setting is not None and space else None
    return f"{flag} {rest}" if flag is not None else message


def _torch_device(name: str | None) -> Any:
    """``--device`` as a torch.device, refused in one line (status 2) when torch does not know it or lacks it."""
    if name is None:
        return None
    import torch

    try:
        device = torch.device(name)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, ValueError) as error:
        raise click.BadParameter(f"{name!r}: {describe(error)}", param_hint="--device") from None
    return device


@contextlib.contextmanager
def _masks_if(wanted: bool) -> Iterator[None]:
    """With --masks, keep the masks as bool (a byte per weight) instead of in the weights' dtype."""
    if not wanted:
        yield
        return
    import prunereg

    with prunereg.compact_masks():
        yield
