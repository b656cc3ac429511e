"""The progress bar: drawn on a terminal, absent on a pipe, the items always passed through."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator

import pytest

from prunereg._progress import progress, stderr_is_terminal

pty = pytest.importorskip("pty")


class Terminal:
    """A pseudo-terminal whose writing end stands in for stderr."""

    def __init__(self) -> None:
        self.controller, terminal = pty.openpty()
        self.stream = open(terminal, "w", encoding="utf-8")  # noqa: SIM115  (closed in read_all)

    def read_all(self) -> str:
        self.stream.close()
        shown = b""
        while True:
            try:
                chunk = os.read(self.controller, 4096)
            except OSError:  # the other end is closed and everything has been read
                break
            if not chunk:
                break
            shown += chunk
        os.close(self.controller)
        return shown.decode()


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    """A terminal as stderr. Each test sets it itself: pytest's capture resets stderr between phases."""
    opened = Terminal()
    yield opened
    if not opened.stream.closed:
        opened.stream.close()
        os.close(opened.controller)


def test_a_bar_is_drawn_when_stderr_is_a_terminal(terminal: Terminal, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    assert stderr_is_terminal()
    assert list(progress(range(5), label="counting")) == [0, 1, 2, 3, 4]
    shown = terminal.read_all()
    assert "counting" in shown and "100%" in shown


def test_generators_get_their_total(terminal: Terminal, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    assert list(progress((n * n for n in range(4)), label="squares", total=4)) == [0, 1, 4, 9]
    assert "100%" in terminal.read_all()


def test_nothing_is_drawn_when_disabled_on_a_terminal(terminal: Terminal, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    assert list(progress([1, 2], label="quiet", enabled=False)) == [1, 2]
    assert terminal.read_all() == ""


def test_nothing_is_drawn_on_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    reading, writing = os.pipe()
    pipe = open(writing, "w", encoding="utf-8")  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", pipe)
    assert not stderr_is_terminal()
    assert list(progress(range(3), label="piped")) == [0, 1, 2]
    pipe.close()
    with open(reading, "rb") as handle:
        assert handle.read() == b""


def test_stderr_without_isatty_is_no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", object())
    assert not stderr_is_terminal()
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert list(progress("ab", label="letters")) == ["a", "b"]


def test_stopping_early_finishes_the_bar(terminal: Terminal, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    items = progress(range(10), label="partial")
    assert next(items) == 0
    items.close()
    assert "partial" in terminal.read_all()


def test_forced_on_a_pipe_writes_the_label_once(monkeypatch: pytest.MonkeyPatch) -> None:
    reading, writing = os.pipe()
    pipe = open(writing, "w", encoding="utf-8")  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", pipe)
    assert list(progress(range(3), label="forced", enabled=True)) == [0, 1, 2]
    pipe.close()
    with open(reading, "rb") as handle:
        assert handle.read() == b"forced\n"
