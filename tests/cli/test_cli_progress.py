"""``prunereg oneshot`` and ``shrink`` show progress where stderr is a pipe or a log, and ``--quiet`` silences it.

A run of half an hour with its output going to a file must show that it works:
a line when a pass over the blocks starts and when it ends (and one per block
done, at most every few seconds), plus what it does between the passes
(evaluating). stdout, the command's output, stays exactly as it was.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from prunereg._cli import main

pytest.importorskip("transformers")

from tests.support.tiny_lm import random_text, save_tiny_llama_folder

COMMANDS = {
    "oneshot": ["--method", "wanda", "--sparsity", "0.5"],
    "shrink": ["--method", "flap", "--mlp", "0.5"],
}
# Each pass over the two blocks of the tiny Llama: its start and its end, as prunereg._progress writes them.
BLOCK_LINES = re.compile(r"^(\w+ model\.layers): 0/2, started\n(?:.*\n)*?\1: 2/2 done, \d+ s$", re.MULTILINE)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("progress")
    save_tiny_llama_folder(folder / "dense")
    (folder / "calibration.txt").write_text(random_text(200, seed=1))
    (folder / "eval.txt").write_text(random_text(100, seed=2))
    return folder


def _args(folder: Path, command: str, output: str, *extra: str) -> list[str]:
    return [
        command, str(folder / "dense"), str(folder / output), *COMMANDS[command],
        "--calibration", str(folder / "calibration.txt"), "--samples", "4", "--seq-len", "32",
        "--eval", str(folder / "eval.txt"), *extra,
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
def test_through_a_pipe_each_pass_over_the_blocks_and_each_step_is_a_line(folder: Path, command: str) -> None:
    """A real pipe, every line; the fast loop checks the last block line through the commands' own subprocess tests
    (tests/cli/test_cli_oneshot.py, tests/shrink/test_cli_shrink.py) and every line in the runner below."""
    script = Path(sys.executable).with_name("prunereg")
    piped = subprocess.run(
        [str(script), *_args(folder, command, f"{command}-piped")],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert BLOCK_LINES.search(piped.stderr), piped.stderr
    for line in ("perplexity on eval.txt, before", "perplexity on eval.txt, after"):
        assert line in piped.stderr.splitlines(), piped.stderr
    assert "\r" not in piped.stderr  # lines for a log, no bar redrawn
    assert piped.stdout.rstrip().endswith(f"wrote {folder / f'{command}-piped'}")
    assert "started" not in piped.stdout and "perplexity on eval.txt," not in piped.stdout


def _without_times(output: str) -> str:
    """The command's output less its decimals (the report's timings differ from run to run)."""
    return re.sub(r"\d+\.\d+", "N", output)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_in_click_s_runner_progress_goes_to_stderr_and_quiet_silences_it(folder: Path, command: str) -> None:
    shown = CliRunner().invoke(main, _args(folder, command, f"{command}-runner", "--json"))
    assert shown.exit_code == 0, shown.output
    assert BLOCK_LINES.search(shown.stderr), shown.stderr
    assert "started" not in shown.stdout  # --json stays JSON
    quiet = CliRunner().invoke(main, _args(folder, command, f"{command}-runner-quiet", "--json", "-q"))
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == ""
    assert _without_times(quiet.stdout) == _without_times(shown.stdout)  # the same report, less its timings


def test_in_a_log_a_failure_is_the_one_line_after_the_progress(folder: Path) -> None:
    """The error stays one line, the last: what was done before it shows where the run stopped."""
    failing = ["--layers", "model.nothing.*"]  # refused once the model is loaded: no layer matches
    result = CliRunner().invoke(main, [*_args(folder, "oneshot", "failed"), *failing])
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[0] == "perplexity on eval.txt, before" and lines[-1].startswith("Error: ")
    assert not any(line.startswith("Error: ") for line in lines[:-1])
    quiet = CliRunner().invoke(main, [*_args(folder, "oneshot", "failed-quiet"), *failing, "--quiet"])
    assert quiet.exit_code == 1 and quiet.stderr.splitlines() == [lines[-1]]
