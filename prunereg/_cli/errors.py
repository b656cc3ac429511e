"""One error style for every command: a one-line message and exit status 1, or the traceback with ``--debug``.

:class:`prunereg._cli.app.Command` gives every command a ``--debug`` flag and
runs it inside :func:`errors_in_one_line`, so no command declares either.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator

import click

DEBUG_HELP = "Show the traceback of an error instead of a one-line message."
EXIT_CODES = "Exit codes: 0 success, 1 error (bad file, method or argument), 2 usage error."


@contextlib.contextmanager
def errors_in_one_line(debug: bool) -> Iterator[None]:
    """Turn an error into a one-line message and exit status 1, unless ``debug``.

    Any ``Exception`` counts, ``MemoryError`` and a plugin's
    ``PluginCodeError`` included; Ctrl-C stays click's ``Aborted!``. Errors
    that speak to the user already (a bad file, an unknown method) show their
    first line; others show their type and first sentence. Warnings raised
    meanwhile (torch's, mostly) are held back: shown once the block succeeds,
    dropped when it fails, where they would only come before the one line that
    says what went wrong. prunereg's warnings about plugins are shown either
    way: they may say why a method is missing.
    """
    from prunereg._plugins.registry import PluginWarning

    try:
        with warnings.catch_warnings(record=True) as held:
            yield
    except BrokenPipeError:  # the reader went away: the group ends the command quietly
        raise
    except Exception as error:
        _show(warning for warning in held if debug or issubclass(warning.category, PluginWarning))
        if debug or isinstance(error, click.ClickException):
            raise
        raise click.ClickException(one_line(error)) from None
    _show(held)


def one_line(error: BaseException) -> str:
    """What the user reads of ``error``, printable and on one line.

    An error in what was asked (prunereg's own: a ``ValueError``,
    ``TypeError``, ``LookupError`` or ``OSError``, the file and method errors
    among them) shows its first line, in the command's words where it has
    them (``command_line_message``: ``--blocks``, not ``blocks=``). Any other
    (torch's ``RuntimeError``, ``MemoryError``, a plugin's
    ``PluginCodeError``) shows its type and first sentence, and says how to
    see the traceback.
    """
    from prunereg._disk.errors import CheckpointError
    from prunereg._files.offline import OfflinePruningError
    from prunereg._plugins.registry import UnknownMethodError
    from prunereg._text import describe, printable

    own_words = getattr(error, "command_line_message", None)  # the Python message would name a keyword, not a flag
    if isinstance(own_words, str):
        return printable(own_words)
    if isinstance(error, (CheckpointError, OfflinePruningError, UnknownMethodError, ValueError, TypeError, LookupError,
                          OSError)):  # fmt: skip
        text = error.args[0] if isinstance(error, KeyError) and error.args else error
        lines = [line.strip() for line in str(text).splitlines() if line.strip()]
        if lines:  # the first line, unless it only introduces the next ("... from one of:")
            return printable(" ".join(lines) if lines[0].endswith(":") else lines[0])
    return f"{describe(error)} (run with --debug for the traceback)"


def _show(held: Iterable[warnings.WarningMessage]) -> None:
    for warning in held:
        warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
