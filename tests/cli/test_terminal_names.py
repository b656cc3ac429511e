"""Names from files reach the terminal printable: no escape sequence of theirs acts on it (issue 20, item 13).

Tensor names and file names came out raw: a name holding ``ESC [2J`` cleared the
screen, ``ESC ]0;...BEL`` retitled the window. Every command prints them as
registry text already was: ANSI sequences removed, other control characters
escaped (``\\r`` as the two characters backslash and r).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

from prunereg._cli import main
from prunereg._text import printable

CLEAR_SCREEN = "\x1b[2J\x1b[H"
RETITLE = "\x1b]0;owned\x07"
HOSTILE = f"evil{CLEAR_SCREEN}.{RETITLE}layer\r.weight"
RAW = ("\x1b", "\x07", "\r")


def _invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="prunereg")


def _assert_printable(result: Result) -> None:
    for text in (result.stdout, result.stderr):
        assert not any(raw in text for raw in RAW), repr(text)


@pytest.fixture
def hostile_file(tmp_path: Path) -> Path:
    folder = tmp_path / f"dir{RETITLE}"
    folder.mkdir()
    path = folder / f"model{CLEAR_SCREEN}.pt"
    torch.save({HOSTILE: torch.randn(4, 4), f"{RETITLE}.bias": torch.randn(4), "plain.weight": torch.randn(4, 4)}, path)
    return path


@pytest.mark.parametrize("extra", [[], ["--by", "block"], ["--by", "type"]])
def test_report_prints_hostile_names_printable(hostile_file: Path, extra: list[str]) -> None:
    result = _invoke("report", hostile_file, *extra)
    assert result.exit_code == 0, result.stderr
    _assert_printable(result)
    if not extra:
        assert printable(HOSTILE) in result.stdout  # the name, made visible: "evil.layer\\r.weight"
        assert "evil.layer\\r.weight" in result.stdout


def test_report_json_escapes_them_as_json(hostile_file: Path) -> None:
    result = _invoke("report", hostile_file, "--json")
    _assert_printable(result)
    assert HOSTILE in [row["name"] for row in json.loads(result.stdout)["tensors"]]  # the data stays exact


@pytest.mark.parametrize("extra", [[], ["--dry-run"], ["--include", "evil*", "--include", "nothing"]])
def test_prune_prints_hostile_names_and_paths_printable(hostile_file: Path, extra: list[str]) -> None:
    output = hostile_file.parent / f"out{CLEAR_SCREEN}.pt"
    result = _invoke("prune", hostile_file, output, "--method", "l1_unstructured", "--amount", "0.5", *extra)
    assert result.exit_code == 0, result.stderr
    _assert_printable(result)
    assert "evil.layer\\r.weight" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["report", "{dir}/missing\x1b[2J.pt"],
        ["prune", "{file}", "{file}", "--method", "identity", "--force"],
        ["prune", "{file}", "{dir}/o.pt", "--method", "l1_unstructured", "--amount", "0.5", "--include", "x\x1b[2J"],
        ["prune", "{file}", "{dir}/o.pt", "--method", "no\x1b]0;t\x07such"],
        ["prune", "{file}", "{dir}/o.pt", "--method", "l1_unstructured", "--amount", "500", "--include", "evil*"],
        ["report", "{dir}"],
    ],
)
def test_errors_print_hostile_names_printable(hostile_file: Path, args: list[str]) -> None:
    values = {"file": hostile_file, "dir": hostile_file.parent}
    result = _invoke(*[arg.format(**values) for arg in args])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
    _assert_printable(result)


def test_oneshot_prints_its_output_folder_printable(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from tests.support.tiny_lm import random_text, save_tiny_llama_folder

    save_tiny_llama_folder(tmp_path / "model")
    (tmp_path / f"text{RETITLE}.txt").write_text(random_text(200, seed=1))  # the --eval file's name is printed
    output, text = tmp_path / f"out{CLEAR_SCREEN}", tmp_path / f"text{RETITLE}.txt"
    result = _invoke(
        "oneshot", tmp_path / "model", output, "--method", "magnitude", "--calibration", text,
        "--samples", "2", "--seq-len", "16", "--eval", text, "--eval-tokens", "32",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert not any(raw in result.stdout for raw in RAW), result.stdout
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr  # transformers' own bars use \r
    assert result.stdout.splitlines()[-1] == f"wrote {printable(str(output))}"
