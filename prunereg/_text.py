"""Text that is safe to print: one line, no terminal control sequences.

Method names, summaries, plugin names and exception messages come from
third-party code; a carriage return or an ANSI escape in them must not rewrite
what a terminal shows, and a newline must not split a one-line message.
"""

from __future__ import annotations

import os
import re

_ANSI_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")


def printable(text: str) -> str:
    """``text`` with ANSI escape sequences removed and every other unprintable character escaped.

    Unprintable means what :meth:`str.isprintable` says (control characters,
    line and paragraph separators, non-breaking and other special spaces);
    each becomes its Python escape (``\\r``, ``\\x0b``, ``\\u2028``), so it is
    visible instead of acting on the terminal.
    """
    cleaned = _ANSI_SEQUENCE.sub("", text)
    if cleaned.isprintable():
        return cleaned
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in cleaned)


def describe(error: BaseException) -> str:
    """``Type: first sentence of the message``: an error in one printable line, whatever its ``__str__`` does.

    The lines of a message are joined before its first sentence is taken, so a
    message whose first line only introduces the problem keeps what follows
    (pluggy names the offending hook argument on its third line); long
    explanations after the first sentence (torch's) are left out.
    """
    try:
        message = str(error)
    except Exception:  # a hostile or broken __str__ must not break the report about it
        message = "<the message cannot be read>"
    joined = " ".join(line.strip() for line in message.splitlines() if line.strip())
    sentence_end = joined.find(". ")
    first = joined if sentence_end == -1 else joined[: sentence_end + 1]
    return printable(f"{type(error).__name__}: {first}" if first else type(error).__name__)


def quoted(path: str | os.PathLike[str]) -> str:
    """``path`` in quotes for a one-line message, with newlines and other control characters escaped."""
    return repr(os.fspath(path))
