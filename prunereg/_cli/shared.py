"""What the model-folder commands (``oneshot``, ``shrink``, ``slim``) share: flags, the output folder, the results.

A flag that means the same in several commands is declared once here
(``--calibration``, ``--samples``, ``--seq-len``, ``--dtype``, ``--eval`` and its
window and length, ``--force``, ``--json``, ``--quiet``), numbers are read with the one
value parser (:class:`~prunereg._cli.values.Number`: ``1_0`` refused), and a
settings object's fields become flags through :func:`settings_as_options`.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import click

from prunereg._cli.values import Number
from prunereg._runtime.options import Options, cli_flag, value_type
from prunereg._text import printable

if TYPE_CHECKING:
    from prunereg._disk.folder import AtomicFolder

DTYPES = ("auto", "float32", "bfloat16", "float16")

_Command = Callable[..., Any]


def settings_as_options(options: type[Options]) -> Callable[[_Command], _Command]:
    """A decorator giving a command a click option for each of ``options``' settings with a flag.

    The flag's type, help and default are read from the setting.
    """

    def decorate(command: _Command) -> _Command:
        for name, (default, setting) in reversed(options.settings().items()):
            flag = cli_flag(name, setting)
            if flag is None:
                continue
            kind: Any = value_type(name, options)
            if setting.choices is not None:
                kind = click.Choice(setting.choices)
            elif kind in (int, float):
                kind = Number(kind, setting.minimum)
            command = click.option(
                flag,
                name,
                type=kind,
                default=None if default is None or setting.repeatable else default,
                show_default=default is not None and not setting.repeatable,
                multiple=setting.repeatable,
                metavar=setting.metavar,
                help=setting.help + (" Repeatable." if setting.repeatable else ""),
            )(command)
        return command

    return decorate


def _stacked(*decorators: Callable[[_Command], _Command]) -> Callable[[_Command], _Command]:
    def decorate(command: _Command) -> _Command:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return decorate


def calibration_options(*, required: bool = True, help: str = "") -> Callable[[_Command], _Command]:
    """``--calibration FILE``, ``--samples N`` and ``--seq-len N``: the calibration text and how much of it."""
    return _stacked(
        click.option(
            "--calibration",
            required=required,
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help=help or "Text file whose first tokens calibrate the method.",
        ),
        click.option("--samples", type=Number(int, 1), default=64, show_default=True, help="Calibration samples."),
        click.option("--seq-len", type=Number(int, 2), default=256, show_default=True, help="Tokens per sample."),
    )


dtype_option = click.option(
    "--dtype",
    type=click.Choice(DTYPES),
    default="auto",
    show_default=True,
    help="The dtype to load the model in (auto: the checkpoint's own).",
)

stream_option = click.option(
    "--stream",
    is_flag=True,
    help="Read one block at a time from MODEL_DIR's safetensors files (models larger than memory), in the "
    "checkpoint's own dtype; --eval still loads the whole model.",
)

eval_options = _stacked(
    click.option(
        "--eval",
        "eval_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Text file: print perplexity before and after (loads the whole model).",
    ),
    click.option(
        "--eval-window",
        type=Number(int, 2),
        default=512,
        show_default=True,
        help="Tokens per window of --eval: the text is scored in non-overlapping windows of N tokens.",
    ),
    click.option("--eval-tokens", type=Number(int, 2), help="Evaluate only the first N tokens of --eval."),
)

force_option = click.option(
    "--force", is_flag=True, help="Replace OUTPUT_DIR if it holds files (in one step, once complete)."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
quiet_option = click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="No progress on stderr (shown by default: a bar on a terminal, a line per block in a pipe or a log).",
)


def library_bars_unless(quiet: bool) -> contextlib.AbstractContextManager[None]:
    """With ``--quiet``, transformers' own bars (loading weights) are silenced too; else they follow our rule."""
    from prunereg._progress import library_bars

    return library_bars(enabled=False if quiet else None)


def output_folder(output_dir: Path, model_dir: Path, force: bool) -> AtomicFolder:
    """OUTPUT_DIR's writer, checked before any work: not MODEL_DIR, not holding it, empty unless --force."""
    from prunereg._disk.folder import AtomicFolder

    folder = AtomicFolder(output_dir, replace=force, keep={"MODEL_DIR": model_dir})
    try:
        folder.check()
    except OSError as error:
        raise click.ClickException(str(error)) from error
    return folder


def bytes_to_write(model: Any, masks: bool = False) -> int:
    """About what OUTPUT_DIR will take: the model's weights, and one byte per weight for the masks."""
    parameters = {id(p): p for p in model.parameters()}.values()
    total = sum(p.numel() * p.element_size() for p in parameters)
    return total + (sum(p.numel() for p in parameters) if masks else 0)


def torch_dtype(name: str) -> Any:
    """``--dtype`` as what ``from_pretrained`` takes: ``"auto"`` or a torch dtype."""
    import torch

    return name if name == "auto" else getattr(torch, name)


def read_eval_ids(tokenizer: Any, path: Path, limit: int | None) -> Any:
    """The evaluation text's first ``--eval-tokens`` tokens (all without it), read no further than needed."""
    from prunereg._runtime.calibration import text_file_ids

    tokens = text_file_ids(tokenizer, path, limit)
    if tokens.numel() < 2:
        raise click.ClickException(f"{path} has fewer than 2 tokens to evaluate on")
    return tokens


class _Report(Protocol):
    def as_dict(self) -> dict[str, Any]: ...


@dataclass
class Results:
    """What a command has computed so far: shown at the end, or before the error when a later step fails."""

    eval_name: str | None
    report: _Report | None = None
    before: float | None = None
    after: float | None = None

    def measure(self, when: Literal["before", "after"], model: Any, ids: Any, window: int, shown: bool) -> None:
        """The perplexity on the --eval text ``before`` or ``after``, announced first: a long text takes minutes."""
        import prunereg
        from prunereg._progress import step

        step(f"perplexity on {printable(self.eval_name or '')}, {when}", enabled=shown)
        setattr(self, when, prunereg.perplexity(model, ids, window=window))

    def streamed(
        self,
        run: Callable[[], Any],
        source: Callable[[], Any],
        output: Callable[[], Any],
        ids: Any,
        window: int,
        shown: bool,
    ) -> None:
        """A ``--stream`` run, whose report is kept; with ``--eval`` (``ids``), the model is loaded only to be
        measured: ``source()`` (MODEL_DIR) before the run, ``output()`` (what it wrote) after."""
        if ids is not None:
            self.measure("before", source(), ids, window, shown)
        self.report = run()
        if ids is not None:
            self.measure("after", output(), ids, window, shown)

    def show(self, as_json: bool) -> None:
        """The report and perplexities; in JSON a perplexity that is no finite number is ``null`` (JSON has none)."""
        if as_json:
            report = self.report.as_dict() if self.report is not None else None
            perplexities = {"perplexity_before": _finite(self.before), "perplexity_after": _finite(self.after)}
            click.echo(json.dumps({**(report or {}), **perplexities}, indent=2, allow_nan=False))
            return
        if self.report is not None:
            click.echo(str(self.report))
        if self.before is not None:
            after = f", {_shown(self.after)} after" if self.after is not None else ""
            click.echo(f"perplexity on {printable(self.eval_name or '')}: {_shown(self.before)} before{after}")
            for value in (self.before, self.after):
                if value is not None and not math.isfinite(value):
                    click.echo(f"note: {_why_not_finite(value)}", err=True)
                    break

    @contextlib.contextmanager
    def shown_on_failure(self, as_json: bool) -> Iterator[None]:
        """Show what was computed before an error (or Ctrl-C) ends the command."""
        try:
            yield
        except BaseException:
            if self.report is not None or self.before is not None:
                self.show(as_json)
            raise


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _shown(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else ("NaN" if math.isnan(value) else "infinite")


def _why_not_finite(value: float) -> str:
    if math.isnan(value):
        return (
            "a perplexity of NaN: the model's outputs hold NaN or infinity (its weights, or an overflow in its dtype)"
        )
    return "an infinite perplexity: the mean loss on the text exceeds what a float can exponentiate (about 709 nats)"
