"""The progress bar: drawn on a terminal and in a notebook, absent on a pipe, the items always passed through."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from prunereg import _progress
from prunereg._progress import in_notebook, library_bars, progress, stderr_is_terminal, step

pty = pytest.importorskip("pty")
fcntl = pytest.importorskip("fcntl")
termios = pytest.importorskip("termios")


class Terminal:
    """A pseudo-terminal whose writing end stands in for stderr."""

    def __init__(self) -> None:
        self.controller, terminal = pty.openpty()
        # 80 x 24, as a terminal window is: a new pseudo-terminal is 0 columns wide, and tqdm draws nothing in that.
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
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


def _piped_stderr(monkeypatch: pytest.MonkeyPatch) -> Callable[[], str]:
    """stderr as the writing end of a pipe; the returned function closes it and gives what was written."""
    reading, writing = os.pipe()
    pipe = open(writing, "w", encoding="utf-8")  # noqa: SIM115  (closed by the function returned)
    monkeypatch.setattr(sys, "stderr", pipe)

    def written() -> str:
        pipe.close()
        with open(reading, "rb") as handle:
            return handle.read().decode()

    return written


def test_forced_on_a_pipe_writes_a_first_and_a_last_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A log shows that the loop started and when it ended; lines in between wait LINE_EVERY seconds."""
    written = _piped_stderr(monkeypatch)
    assert list(progress(range(3), label="forced", enabled=True)) == [0, 1, 2]
    assert written() == "forced: 0/3, started\nforced: 3/3 done, 0 s\n"


def test_on_a_pipe_each_item_done_gets_a_line_with_an_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter([0.0, 40.0, 80.0, 200.0, 4000.0])  # the start, then as each item is done
    monkeypatch.setattr(_progress, "_now", lambda: next(ticks))
    monkeypatch.setattr(_progress, "LINE_EVERY", 30.0)
    written = _piped_stderr(monkeypatch)
    assert list(progress("abcd", label="wanda model.layers", enabled=True)) == list("abcd")
    assert written().splitlines() == [
        "wanda model.layers: 0/4, started",
        "wanda model.layers: 1/4 done, 40 s, about 2 min 0 s left",
        "wanda model.layers: 2/4 done, 1 min 20 s, about 1 min 20 s left",
        "wanda model.layers: 3/4 done, 3 min 20 s, about 1 min 7 s left",
        "wanda model.layers: 4/4 done, 1 h 6 min",
    ]


def test_on_a_pipe_lines_come_at_most_every_line_every_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter([0.0, 1.0, 2.0, 6.0, 7.0, 8.0])
    monkeypatch.setattr(_progress, "_now", lambda: next(ticks))
    monkeypatch.setattr(_progress, "LINE_EVERY", 5.0)
    written = _piped_stderr(monkeypatch)
    assert list(progress((n for n in range(5)), label="blocks", enabled=True)) == [0, 1, 2, 3, 4]
    assert written().splitlines() == ["blocks: started", "blocks: 3 done, 6 s"]  # no total: nothing to estimate


def test_steps_are_lines_where_progress_is_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    written = _piped_stderr(monkeypatch)
    step("loading MODEL_DIR", enabled=True)
    step("never shown", enabled=False)
    step("not watched: not shown")
    assert written() == "loading MODEL_DIR\n"


def test_a_bar_is_drawn_in_a_notebook() -> None:
    """In a Jupyter kernel stderr is no terminal, yet a person watches it: the bar is drawn, without cursor codes."""
    pytest.importorskip("ipykernel")
    manager = pytest.importorskip("jupyter_client.manager")
    kernel, client = manager.start_new_kernel(kernel_name="python3")
    try:
        request = client.execute(
            "from prunereg._progress import progress, stderr_is_terminal\n"
            "assert not stderr_is_terminal()\n"
            "assert list(progress(range(4), label='blocks')) == [0, 1, 2, 3]\n"
        )
        shown, status = "", None
        while status != "idle":
            message = client.get_iopub_msg(timeout=60)
            if message["parent_header"].get("msg_id") != request:
                continue
            content = message["content"]
            if message["msg_type"] == "stream" and content["name"] == "stderr":
                shown += content["text"]
            elif message["msg_type"] == "error":
                pytest.fail("\n".join(content["traceback"]))
            status = content.get("execution_state", status)
    finally:
        client.stop_channels()
        kernel.shutdown_kernel(now=True)
    assert "blocks" in shown and "100%" in shown, shown
    assert "\033[?25" not in shown and shown.startswith("\r"), shown


def test_outside_a_kernel_there_is_no_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    assert not in_notebook()
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: None))
    assert not in_notebook()  # IPython imported, but no shell running (or a terminal IPython's: not a kernel)


def _saved_tiny_model(folder: Path) -> None:
    pytest.importorskip("transformers")
    from tests.support.tiny_lm import tiny_llama

    tiny_llama().save_pretrained(folder)


LOAD = (
    "import prunereg, sys; from transformers import LlamaForCausalLM; "
    "prunereg.from_pretrained(LlamaForCausalLM, sys.argv[1])"
)


@pytest.mark.slow
def test_transformers_bars_stay_out_of_a_log_file(tmp_path: Path) -> None:
    _saved_tiny_model(tmp_path / "model")
    with open(tmp_path / "log", "w") as log:
        subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / "model")], stderr=log, check=True, timeout=300)
    assert "Loading weights" not in (tmp_path / "log").read_text()


def test_transformers_bars_stay_on_a_terminal(
    tmp_path: Path, terminal: Terminal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as transformers_logging

    import prunereg

    _saved_tiny_model(tmp_path / "model")
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    prunereg.from_pretrained(LlamaForCausalLM, tmp_path / "model")
    assert "Loading weights" in terminal.read_all()
    assert transformers_logging.is_progress_bar_enabled()


def test_library_bars_are_switched_back_on_after_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    transformers_logging = pytest.importorskip("transformers.utils.logging")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert transformers_logging.is_progress_bar_enabled()
    with pytest.raises(KeyError), library_bars():
        assert not transformers_logging.is_progress_bar_enabled()
        raise KeyError("the block fails")
    assert transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()  # a user's choice is kept
    try:
        with library_bars(enabled=True):
            assert not transformers_logging.is_progress_bar_enabled()
        assert not transformers_logging.is_progress_bar_enabled()
    finally:
        transformers_logging.enable_progress_bar()
