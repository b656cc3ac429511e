"""The ``prunereg`` command group, which every command module attaches its commands to.

Every command runs with prunereg's output on streams of its own
(:func:`prunereg._cli.streams.own_streams`): what plugins and libraries print
to stdout never mixes with a command's output. Every error message is made
printable (:func:`prunereg._text.printable`): a file or tensor name in it
cannot clear the screen or retitle the window. Every command gets ``--debug``
and one error style from :class:`Command`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import click

from prunereg import __version__
from prunereg._cli.errors import DEBUG_HELP, errors_in_one_line
from prunereg._cli.streams import CLOSED_PIPE_STATUS, own_streams
from prunereg._text import printable


class Command(click.Command):
    """A command with ``--debug``, whose errors are one line (:func:`~prunereg._cli.errors.errors_in_one_line`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(click.Option(["--debug"], is_flag=True, help=DEBUG_HELP))

    def invoke(self, ctx: click.Context) -> Any:
        debug = bool(ctx.params.pop("debug", False))
        with errors_in_one_line(debug):
            return super().invoke(ctx)


class Group(click.Group):
    """A click group whose commands, help and errors write to prunereg's own stdout and stderr."""

    command_class = Command

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        with own_streams(until_exit=standalone_mode):
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:  # fmt: skip
        with _quiet_on_closed_pipe():  # the group's own --help and --version print here
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with _quiet_on_closed_pipe():
                return super().invoke(ctx)
        except click.ClickException as error:  # names of files and tensors: no escape sequence reaches the terminal
            setattr(error, "message", printable(error.message))  # noqa: B010  # Final in click's annotations only
            raise


@contextlib.contextmanager
def _quiet_on_closed_pipe() -> Iterator[None]:
    """A reader that went away (``| head``) ends the command quietly, with a Unix tool's status (see streams)."""
    try:
        yield
    except BrokenPipeError:
        raise click.exceptions.Exit(CLOSED_PIPE_STATUS) from None


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="prunereg")
def main() -> None:
    """Make PyTorch models smaller and faster, and prune them with any registered method.

    \b
    A smaller, faster model:
      slim     any model folder: remove channels and heads (prunereg.slim for any nn.Module)
      shrink   a language model: remove MLP channels, key/value groups, blocks or experts
    Masks (zeros, same size): prune and report (model files), oneshot (language models).
    """
