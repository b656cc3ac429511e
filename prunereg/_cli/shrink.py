"""``prunereg shrink``: make a Hugging Face causal LM folder smaller, its parts removed by a shrink method.

The safeties are ``prunereg oneshot``'s, through the same helpers: MODEL_DIR is
read as untrusted input (:mod:`prunereg._models.hf_folder`), the calibration
text is tokenised the same way, and OUTPUT_DIR is written through
:class:`~prunereg._disk.folder.AtomicFolder` inside the signal clean-up: whole
or not at all, never over MODEL_DIR, replaced only with ``--force``. The output
loads with stock ``transformers``; with ``--allocation global`` the blocks keep
different widths, and it loads with ``prunereg.from_pretrained`` (the output says so).
"""

from __future__ import annotations

import dataclasses
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
from prunereg._shrink.options import ShrinkOptions
from prunereg._text import printable

if TYPE_CHECKING:
    pass


@main.command("shrink", epilog=EXIT_CODES)
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("output_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--method",
    "-m",
    required=True,
    help="A shrink method: flap, wanda_sp, magnitude_sp, block_influence, reap (prunereg list --kind shrink).",
)
@calibration_options(
    required=False,
    help="Text file whose first tokens calibrate the method (every method but magnitude_sp needs one).",
)
@settings_as_options(ShrinkOptions)
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
    "--recover-option",
    "recover_options",
    multiple=True,
    metavar="KEY=VALUE",
    callback=key_values,
    help="An option of the --recover method, e.g. --recover-option epochs=3 (repeatable; see prunereg info METHOD).",
)
@dtype_option
@stream_option
@eval_options
@force_option
@json_option
@quiet_option
def shrink_command(
    model_dir: Path,
    output_dir: Path,
    method: str,
    calibration: Path | None,
    samples: int,
    seq_len: int,
    options: dict[str, Any],
    recover_options: dict[str, Any],
    dtype: str,
    stream: bool,
    eval_file: Path | None,
    eval_window: int,
    eval_tokens: int | None,
    force: bool,
    as_json: bool,
    quiet: bool,
    **flags: Any,
) -> None:
    """Shrink the causal language model in MODEL_DIR into OUTPUT_DIR: fewer channels, heads, blocks or experts.

    The config in OUTPUT_DIR states the new sizes, so stock transformers loads
    it (with --allocation global the blocks differ: prunereg.from_pretrained
    loads it). MODEL_DIR is untrusted: none of its code runs, no link out of it
    is followed. OUTPUT_DIR appears only when complete; one that holds files is
    replaced only with --force. Every argument is checked before the model
    loads; any error is one line (--debug: the traceback).

    \b
    prunereg shrink ./SmolLM2 ./SmolLM2-flap -m flap --mlp 0.5 --heads 0.34 --calibration text.txt
    prunereg shrink ./SmolLM2 ./SmolLM2-short -m block_influence --layers 6 --calibration text.txt --eval test.txt
    prunereg shrink ./SmolLM2 ./SmolLM2-refit -m flap --mlp 0.5 --recover refit --calibration text.txt
    """
    if stream and dtype != "auto":
        raise click.UsageError("--stream keeps the checkpoint's dtype; leave --dtype out or drop --stream")
    method_options = dict(options)
    _refuse_shrink_arguments(method_options)
    settings = _with_recovery(_settings(flags, progress=not quiet), dict(recover_options))
    if stream and settings.allocation == "global":
        raise click.UsageError("--allocation global ranks every block before cutting any; drop --stream")
    output = output_folder(output_dir, model_dir, force)
    try:
        from transformers import AutoModelForCausalLM  # noqa: F401
    except ImportError as error:
        raise click.ClickException(
            "prunereg shrink needs transformers: pip install -c constraints.txt -e '.[hf]' in prunereg's clone"
        ) from error

    import prunereg
    from prunereg._models.hf_folder import load_causal_lm, load_tokenizer
    from prunereg._recover.folder import StreamedShrink
    from prunereg._runtime.calibration import CLI_SPELLING, samples_from_text_file
    from prunereg._runtime.ranks import Ranks, launched_group, together

    results = Results(eval_file.name if eval_file is not None else None)
    with launched_group(None), results.shown_on_failure(as_json), library_bars_unless(quiet):
        ranks = Ranks.current(settings.data_parallel)  # under torchrun: rank 0 writes, the others calibrate beside it
        with together(ranks):
            tokenizer = load_tokenizer(model_dir)
            ids = None
            if calibration is not None:
                ids = samples_from_text_file(tokenizer, calibration, samples, seq_len, CLI_SPELLING)

            def load(folder: Path, label: str = "MODEL_DIR") -> Any:
                return load_causal_lm(folder, dtype=torch_dtype(dtype), label=label)

            def shrunk(model: Any) -> Any:
                return prunereg.shrink(model, method, ids, **dataclasses.asdict(settings), **method_options)

            if ranks is not None and ranks.rank != 0:
                if stream:
                    StreamedShrink(None, method, ids, method_options, label="MODEL_DIR").run(model_dir, None, settings)
                else:
                    shrunk(load(model_dir))
                return
            eval_ids = read_eval_ids(tokenizer, eval_file, eval_tokens) if eval_file is not None else None
            with cleanup_on_signals(), output as staging:
                if stream:
                    request = StreamedShrink(output, method, ids, method_options, label="MODEL_DIR")
                    results.streamed(
                        lambda: request.run(model_dir, staging, settings),
                        lambda: load(model_dir), lambda: load(staging, "OUTPUT_DIR"), eval_ids, eval_window, not quiet,
                    )  # fmt: skip
                else:
                    model = load(model_dir)
                    output.require_free_space(bytes_to_write(model))
                    if eval_ids is not None:
                        results.measure("before", model, eval_ids, eval_window, not quiet)
                    results.report = shrunk(model)
                    if eval_ids is not None:
                        results.measure("after", model, eval_ids, eval_window, not quiet)
                    model.save_pretrained(staging)
                tokenizer.save_pretrained(staging)
    results.show(as_json)
    if not as_json:
        click.echo(f"wrote {printable(str(output_dir))}")


def _refuse_shrink_arguments(method_options: dict[str, Any]) -> None:
    """``-o`` passes the method's own options; shrink's settings have their flags."""
    own = {*ShrinkOptions.names(), "tokenizer", "num_samples", "seq_len", "calibration"}
    flags = {param.name: param.opts[0] for param in click.get_current_context().command.params}
    for key in method_options:
        if key in own:
            where = f"give it as {flags[key]}" if key in flags else "the command sets it"
            raise click.UsageError(f"-o {key}: {key} is shrink's own setting, not the method's; {where}")


def _with_recovery(settings: ShrinkOptions, options: dict[str, Any]) -> ShrinkOptions:
    """``settings`` with ``--recover``'s method configured by ``--recover-option``, checked before anything loads."""
    if settings.recover is None:
        if options:
            raise click.UsageError("--recover-option configures the --recover method; give --recover METHOD too")
        return settings
    if not options:
        return settings
    from prunereg._recover.engine import build_method

    try:
        method, _ = build_method(settings.recover, options)
    except (TypeError, ValueError) as error:
        raise click.UsageError(f"--recover-option: {error}") from None
    return dataclasses.replace(settings, recover=method)


def _settings(flags: dict[str, Any], progress: bool) -> ShrinkOptions:
    """The run's settings from their flags; checked here, before anything loads (a bad one: one line, status 2)."""
    given = {name: flags[name] for name in ShrinkOptions.names() if name in flags}
    try:
        # A failure discards the model and OUTPUT_DIR both: nothing to put back.
        return ShrinkOptions(**given, progress=progress, restore_on_error=False)
    except (TypeError, ValueError) as error:
        raise click.UsageError(str(error)) from None
