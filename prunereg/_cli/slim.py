"""``prunereg slim``: make a Hugging Face model folder physically smaller, channels and heads removed.

The model comes from MODEL_DIR, read as untrusted input
(:mod:`prunereg._models.hf_folder`: none of its code runs, nothing outside it
is read, no weight is made up); ``config.json``'s ``architectures`` names the
transformers class. :func:`prunereg.slim` runs on an example input the config
describes (a few token ids, or one image of the config's size). Without
``--ratio`` it removes the channels the folder's masks
(``prunereg_masks.safetensors``, from ``prunereg.save_pretrained`` or
``prunereg oneshot --masks``) pruned whole. The slimmed model is written to
OUTPUT_DIR through :class:`~prunereg._disk.folder.AtomicFolder` (whole or not
at all), with the tokenizer and preprocessor files copied, and loads with
``from_pretrained`` (stock transformers when the config states the new
widths, else ``prunereg.from_pretrained``). Needs the ``hf`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import click

from prunereg._cli import shared
from prunereg._cli.app import main
from prunereg._cli.errors import EXIT_CODES
from prunereg._cli.values import Number
from prunereg._disk.signals import cleanup_on_signals
from prunereg._text import printable

EXAMPLES = (
    "prunereg slim ./resnet-50 ./resnet-50-slim --ratio 0.5",
    "prunereg slim ./vit-base ./vit-base-slim --ratio 0.3 --importance taylor --json",
    "prunereg slim ./pruned ./pruned-slim        # the channels the folder's masks pruned",
    "prunereg slim ./Llama-3.1-70B ./Llama-slim --ratio 0.25 --stream   # tensor by tensor, never all in memory",
)
"""``--help``'s examples, the same lines as docs/cli.md's (a test holds them equal)."""

_SHRINK_HINT = (
    "note: MODEL_DIR holds a causal language model ({name}). slim removes channels of its residual stream too "
    "(the hidden size), which costs most of its quality; prunereg shrink removes MLP channels, heads and blocks "
    "and keeps the residual width: it is the tool for language models (docs/shrinking.md)"
)


@main.command("slim", epilog=EXIT_CODES)
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("output_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--ratio",
    type=Number(float, 0, below=1),
    metavar="X",
    help="Share of every dependency group's channels (heads, convolution groups) to remove, in [0, 1). Without "
    "it: the channels MODEL_DIR's masks pruned whole.",
)
@click.option(
    "--importance",
    help="How channels are ranked, with --ratio: magnitude, random, taylor, or a registered importance "
    "[default: magnitude].",
)
@shared.calibration_options(
    required=False,
    help="Text file whose first tokens give --importance taylor its gradient (a language model's loss on them); "
    "without it, the gradient of the output's sum on a made-up input.",
)
@click.option("--ignore", multiple=True, metavar="MODULE", help="A module to keep whole (its name). Repeatable.")
@click.option(
    "--round-to", type=Number(int, 1), default=1, show_default=True, help="With --ratio, keep a multiple of N."
)
@click.option(
    "--grouped",
    type=click.Choice(["whole", "inside"]),
    default="whole",
    show_default=True,
    help="How a grouped convolution loses channels: whole groups, or the same channels inside every group.",
)
@shared.dtype_option
@shared.stream_option
@shared.eval_options
@shared.force_option
@shared.json_option
@shared.quiet_option
def slim_command(
    model_dir: Path,
    output_dir: Path,
    ratio: float | None,
    importance: str | None,
    calibration: Path | None,
    samples: int,
    seq_len: int,
    ignore: tuple[str, ...],
    round_to: int,
    grouped: str,
    dtype: str,
    stream: bool,
    eval_file: Path | None,
    eval_window: int,
    eval_tokens: int | None,
    force: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Remove channels and heads from the model in MODEL_DIR and write the smaller model to OUTPUT_DIR.

    MODEL_DIR is untrusted: none of its code runs, no link out of it is
    followed, and weights it lacks or the model does not know are refused.
    OUTPUT_DIR is built beside its place and appears only when complete; one
    that holds files is replaced only with --force. Every argument is checked
    before the model loads; any error is one line (--debug: the traceback).
    For a language model, prunereg shrink is the tool (it keeps the residual width).

    \b
    {examples}
    """
    if calibration is not None and (importance or "magnitude") != "taylor":
        raise click.UsageError("--calibration gives --importance taylor its gradient; the other importances need none")
    if stream and dtype != "auto":
        raise click.UsageError("--stream keeps the checkpoint's dtype; leave --dtype out or drop --stream")
    output = shared.output_folder(output_dir, model_dir, force)
    try:
        import transformers  # noqa: F401
    except ImportError as error:
        raise click.ClickException(
            "prunereg slim needs transformers: pip install -c constraints.txt -e '.[hf]' in prunereg's clone"
        ) from error
    from prunereg._models.hf_folder import checked_model_class, is_causal_lm, load_config, load_tokenizer, model_class
    from prunereg._runtime.calibration import CLI_SPELLING, samples_from_text_file
    from prunereg._slim.engine import ArgumentError, SlimArguments, check_arguments
    from prunereg._slim.folder import check_streamed_arguments

    try:  # before the model loads; an unknown importance is an error of status 1, as an unknown method
        check = check_streamed_arguments if stream else check_arguments
        check(ratio, importance, list(ignore), round_to, grouped)
    except ArgumentError as error:
        raise click.UsageError(error.command_line_message) from None
    config = load_config(model_dir)
    cls = model_class(config)
    causal = is_causal_lm(config, cls)
    if not causal and (calibration is not None or eval_file is not None):
        flag = "--calibration" if calibration is not None else "--eval"
        raise click.UsageError(f"{flag} is a text for a language model, and MODEL_DIR holds a {cls.__name__}")
    results = shared.Results(eval_file.name if eval_file is not None else None)
    with results.shown_on_failure(as_json), shared.library_bars_unless(quiet):
        tokenizer = load_tokenizer(model_dir) if calibration is not None or eval_file is not None else None
        ids = samples_from_text_file(tokenizer, calibration, samples, seq_len, CLI_SPELLING) if calibration else None
        eval_ids = shared.read_eval_ids(tokenizer, eval_file, eval_tokens) if eval_file is not None else None
        if causal:  # once the folder has passed its checks, before the minutes slimming takes
            checked_model_class(model_dir)
            click.echo(_SHRINK_HINT.format(name=cls.__name__), err=True)
        arguments = SlimArguments(ratio, importance if ids is None else _taylor_on(ids), ignore, round_to, grouped)
        run = _Run(model_dir, output, results, arguments, dtype, eval_ids, (eval_window, not quiet))
        run.streamed() if stream else run.in_memory()
    results.show(as_json)
    if not as_json:
        click.echo(f"wrote {printable(str(output_dir))}")


slim_command.help = (slim_command.help or "").replace("{examples}", "\n    ".join(EXAMPLES))


@dataclass
class _Run:
    """One ``prunereg slim``, its flags checked: the folders, the arguments of the slim, and ``--eval``'s text."""

    model_dir: Path
    output: Any
    results: shared.Results
    arguments: Any
    """A :class:`~prunereg._slim.engine.SlimArguments`."""
    dtype: str
    eval_ids: Any
    eval_settings: tuple[int, bool]

    def in_memory(self) -> None:
        """Load MODEL_DIR's model, slim it, and write it to OUTPUT_DIR (``--eval``: measured before and after)."""
        import prunereg
        from prunereg._slim.engine import slim_keeping
        from prunereg._slim.folder import copy_beside_the_weights, example_inputs

        model = _load(self.model_dir, masked=self.arguments.ratio is None, dtype=self.dtype)
        self._measure("before", model)
        self.results.report, _ = slim_keeping(model, example_inputs(model), self.arguments)
        self._measure("after", model)
        with cleanup_on_signals(), self.output as staging:
            if prunereg.is_pruned(model):
                prunereg.save_pretrained(model, staging)
            else:
                model.save_pretrained(staging)
            copy_beside_the_weights(self.model_dir, Path(staging))

    def streamed(self) -> None:
        """``--stream``: slim MODEL_DIR into OUTPUT_DIR tensor by tensor (``--eval`` loads the model)."""
        from prunereg._models.hf_folder import load_model
        from prunereg._slim.folder import slim_folder_into

        with cleanup_on_signals(), self.output as staging:
            self.results.streamed(
                lambda: slim_folder_into(self.model_dir, self.output, Path(staging), "MODEL_DIR", self.arguments),
                lambda: load_model(self.model_dir), lambda: load_model(staging, label="OUTPUT_DIR"),
                self.eval_ids, *self.eval_settings,
            )  # fmt: skip

    def _measure(self, when: Literal["before", "after"], model: Any) -> None:
        if self.eval_ids is not None:
            self.results.measure(when, model, self.eval_ids, *self.eval_settings)


def _taylor_on(ids: Any) -> Any:
    """``taylor`` with the gradient of the language model's loss on the calibration samples, eight at a time."""
    from prunereg._slim.importance import TaylorImportance

    batches = [{"input_ids": batch, "labels": batch, "use_cache": False} for batch in ids.split(8)]
    return TaylorImportance(loss=lambda output: output.loss, batches=batches)


def _load(model_dir: Path, *, masked: bool, dtype: str) -> Any:
    """MODEL_DIR's model in ``--dtype``; with ``masked``, pruned again with the folder's masks (which must exist)."""
    from prunereg._models.hf_folder import checked_model_class, load_model
    from prunereg._models.huggingface import MASKS_FILE, from_pretrained

    if not masked:
        return load_model(model_dir, dtype=shared.torch_dtype(dtype))
    if not (model_dir / MASKS_FILE).is_file():
        raise click.ClickException(
            f"MODEL_DIR has no {MASKS_FILE}, so no channel is pruned yet: give --ratio, or prune it first "
            "(prunereg oneshot --masks, prunereg.save_pretrained of a pruned model)"
        )
    config, cls = checked_model_class(model_dir)
    return from_pretrained(cls, model_dir, config=config, dtype=shared.torch_dtype(dtype)).eval()
