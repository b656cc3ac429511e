"""Text from third parties made printable, and errors described in one line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prunereg._text import describe, printable


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text, spaces kept", "plain text, spaces kept"),
        ("\x1b[31mred\x1b[0m", "red"),
        ("\x1b]0;window title\x07after", "after"),
        ("\x1b[2J\x1b[Hcleared", "cleared"),
        ("carriage\rreturn", "carriage\\rreturn"),
        ("tab\tbell\x07nul\x00", "tab\\tbell\\x07nul\\x00"),
        ("nbsp\xa0ls\u2028vt\x0b", "nbsp\\xa0ls\\u2028vt\\x0b"),
        ("accents stay: é ü 漢", "accents stay: é ü 漢"),
    ],
)
def test_printable_removes_escape_sequences_and_escapes_control_characters(raw: str, shown: str) -> None:
    assert printable(raw) == shown


@given(st.text())
def test_printable_output_is_always_one_printable_line(text: str) -> None:
    shown = printable(text)
    assert shown.replace(" ", "").isprintable()
    assert printable(shown) == shown


class Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


@pytest.mark.parametrize(
    ("error", "described"),
    [
        (ValueError("bad value"), "ValueError: bad value"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (SystemExit(3), "SystemExit: 3"),
        (
            RuntimeError("Weights only load failed. This file can still be loaded, to do so..."),
            "RuntimeError: Weights only load failed.",
        ),
        (
            TypeError("Plugin 'x' for hook 'h'\nhookimpl definition: h(register, extra)\nArgument(s) {'extra'}"),
            "TypeError: Plugin 'x' for hook 'h' hookimpl definition: h(register, extra) Argument(s) {'extra'}",
        ),
        (ImportError("\x1b[31mneeds scipy\x1b[0m\r"), "ImportError: needs scipy"),
        (Hostile(), "Hostile: <the message cannot be read>"),
    ],
)
def test_describe_says_an_error_in_one_printable_line(error: BaseException, described: str) -> None:
    assert describe(error) == described


def test_describe_is_one_short_line() -> None:
    assert describe(EOFError()) == "EOFError"
    assert describe(RuntimeError("bad thing. More detail.\nline two")) == "RuntimeError: bad thing."
