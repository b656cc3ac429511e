"""The model-folder commands share their common flags: declared once, numbers read by the one value parser."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from prunereg._cli import main

SHARED = ("calibration", "samples", "seq_len", "dtype", "stream", "eval_file", "eval_window", "eval_tokens", "force")


def _params(command: str) -> dict[str, click.Parameter]:
    return {param.name: param for param in main.commands[command].params if param.name is not None}


def test_oneshot_and_shrink_declare_their_common_flags_alike() -> None:
    oneshot, shrink = _params("oneshot"), _params("shrink")
    for name in (*SHARED, "as_json", "batch_size", "matmul_precision", "blocks"):
        a, b = oneshot[name], shrink[name]
        assert (a.opts, type(a.type), a.default) == (b.opts, type(b.type), b.default), name
    for name in ("samples", "seq_len", "eval_window", "eval_tokens", "batch_size"):
        assert type(shrink[name].type).__name__ == "Number", name
    slim = _params("slim")
    for name in ("force", "as_json"):
        assert (slim[name].opts, getattr(slim[name], "help", None)) == (
            oneshot[name].opts,
            getattr(oneshot[name], "help", None),
        )


FOLDER_FLAGS = ["--dtype", "--eval", "--eval-window", "--eval-tokens", "--force", "--json", "--quiet", "--debug"]


def _help_of(command: str, flag: str) -> str:
    [option] = [param for param in main.commands[command].params if flag in getattr(param, "opts", ())]
    return f"{option.help} {getattr(option, 'default', None)}"


@pytest.mark.parametrize("flag", FOLDER_FLAGS)
def test_the_three_folder_commands_share_their_common_flags_word_for_word(flag: str) -> None:
    helps = {command: _help_of(command, flag) for command in ("oneshot", "shrink", "slim")}
    assert len(set(helps.values())) == 1, helps
    assert not helps["slim"].startswith("None"), f"{flag} has no help text"


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        ("shrink", "--eval-tokens"),
        ("shrink", "--samples"),
        ("shrink", "--layers"),
        ("shrink", "--mlp"),
        ("shrink", "--batch-size"),
        ("oneshot", "--eval-tokens"),
        ("slim", "--round-to"),
    ],
)
def test_an_underscored_number_is_refused_by_every_command(tmp_path: Path, command: str, flag: str) -> None:
    (tmp_path / "model").mkdir()
    text = tmp_path / "text.txt"
    text.write_text("some text")
    args = [command, str(tmp_path / "model"), str(tmp_path / "out"), flag, "1_0"]
    if command != "slim":
        args += ["-m", "flap" if command == "shrink" else "wanda", "--calibration", str(text)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "'1_0' is not a number here: write it without '_'" in result.stderr
    assert not (tmp_path / "out").exists()
