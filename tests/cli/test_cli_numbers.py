"""Numbers on the command line are decimal, written with the digits 0-9, in every option of every command.

``0x1``, ``0o7``, an Arabic-Indic three and ``1_0`` are refused (Python would read 1, 7, 3 and 10), alone or
inside a literal, naming the option; ``--pattern`` takes N:M in the same digits. Each refusal comes before any
model loads, and writes nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

import prunereg
from prunereg._cli import main
from prunereg._cli.values import parse_value

SCRIPT = Path(sys.executable).with_name("prunereg")
THREE, TWO, FOUR = "\N{ARABIC-INDIC DIGIT THREE}", "\N{ARABIC-INDIC DIGIT TWO}", "\N{ARABIC-INDIC DIGIT FOUR}"
HALF = "\N{ARABIC-INDIC DIGIT ZERO}.\N{ARABIC-INDIC DIGIT FIVE}"
WIDE_ONE, WIDE_SIXTEEN = "\N{FULLWIDTH DIGIT ONE}", "\N{FULLWIDTH DIGIT ONE}\N{FULLWIDTH DIGIT SIX}"
NOT_DECIMAL = "is not a number here: write it in decimal, with the digits 0-9"


@pytest.mark.parametrize(
    ("text", "written"),
    [("0x1", "0x1"), ("-0x1", "0x1"), ("0o7", "0o7"), ("0b11", "0b11"), (THREE, THREE), (WIDE_ONE, WIDE_ONE),
     (HALF, HALF), ("[0x10, 2]", "0x10"), ("(2, 0o7)", "0o7"), ("{'n': 0b1}", "0b1")],
)  # fmt: skip
def test_a_number_not_written_in_decimal_digits_is_refused_not_read_as_another(text: str, written: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_value(text)
    assert str(refused.value) == f"{written!r} {NOT_DECIMAL}"


def test_an_underscore_inside_a_literal_is_refused_as_alone() -> None:
    with pytest.raises(ValueError, match=r"^'1_0' is not a number here: write it without '_'$"):
        parse_value("(1_0, 2)")


@pytest.mark.parametrize(
    ("text", "value"),
    [("+3", 3), ("-2", -2), ("1.", 1.0), (".5", 0.5), ("1E3", 1e3), ("007", 7), (" 4 ", 4), ("(-1, 2.5)", (-1, 2.5)),
     ("²", "²"), ("0x", "0x")],
)  # fmt: skip
def test_decimal_numbers_and_text_that_is_no_number_are_read_as_before(text: str, value: object) -> None:
    assert parse_value(text) == value and type(parse_value(text)) is type(value)


@pytest.fixture
def empty_dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """MODEL_DIR with no model in it (a refusal must come before loading), OUTPUT_DIR's place, a text."""
    (tmp_path / "model").mkdir()
    (tmp_path / "text.txt").write_text("some calibration text\n")
    return tmp_path / "model", tmp_path / "out", tmp_path / "text.txt"


def _refused(result: Result, *expected: str) -> str:
    """The one error line (status 2, a usage error), which must say every one of ``expected``."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: ") and all(part in line for part in expected), line
    return line


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [("shrink", "--mlp", "0x1"), ("shrink", "--layers", "0b1"), ("shrink", "--heads", HALF),
     ("shrink", "--batch-size", THREE), ("oneshot", "--sparsity", "0x1"), ("oneshot", "--samples", "0x10"),
     ("oneshot", "--owl-lambda", "0o1"), ("oneshot", "--seq-len", WIDE_SIXTEEN), ("slim", "--ratio", HALF),
     ("slim", "--ratio", "0.2_5"), ("slim", "--round-to", "0x2")],
)  # fmt: skip
def test_every_numeric_option_refuses_a_number_not_in_decimal_naming_the_option(
    empty_dirs: tuple[Path, Path, Path], command: str, option: str, value: str
) -> None:
    model_dir, out, text = empty_dirs
    args = [command, str(model_dir), str(out), option, value]
    if command != "slim":
        args += ["--method", "flap" if command == "shrink" else "wanda", "--calibration", str(text)]
    _refused(CliRunner().invoke(main, args), f"Invalid value for '{option}'", repr(value), "is not a number here")
    assert not out.exists()


@pytest.mark.parametrize(
    "pattern", ["²:4", "2:⁴", f"{TWO}:{FOUR}", f"{WIDE_ONE}:{WIDE_ONE}6", "0x2:4", "2:4:8", "2.0:4"]
)
def test_oneshot_pattern_takes_n_m_in_the_digits_0_9_and_says_so_naming_the_flag(
    empty_dirs: tuple[Path, Path, Path], pattern: str
) -> None:
    model_dir, out, text = empty_dirs
    args = ["oneshot", str(model_dir), str(out), "-m", "wanda", "--calibration", str(text), "--pattern", pattern]
    line = _refused(CliRunner().invoke(main, args))
    assert line == f"Error: --pattern must look like 'N:M' (e.g. '2:4'), not {pattern!r}"
    assert not out.exists()
    with pytest.raises(ValueError, match=r"^pattern must look like 'N:M' \(e.g. '2:4'\), not "):
        prunereg.oneshot(
            torch.nn.Linear(4, 4), "wanda", calibration=torch.ones(1, 4, dtype=torch.long), pattern=pattern
        )


def test_oneshot_names_its_flags_in_its_settings_errors(empty_dirs: tuple[Path, Path, Path]) -> None:
    model_dir, out, text = empty_dirs
    args = ["oneshot", str(model_dir), str(out), "-m", "wanda", "--calibration", str(text)]
    assert _refused(CliRunner().invoke(main, [*args, "--pattern", "3:2"])) == "Error: --pattern '3:2' needs 0 < N < M"
    assert _refused(CliRunner().invoke(main, [*args, "--sparsity", "2"])).startswith("Error: --sparsity must be in")


@pytest.mark.slow
def test_a_bad_pattern_is_one_line_from_the_installed_command(empty_dirs: tuple[Path, Path, Path]) -> None:
    model_dir, out, text = empty_dirs
    args = [str(SCRIPT), "oneshot", str(model_dir), str(out), "-m", "wanda", "--calibration", str(text)]
    completed = subprocess.run([*args, "--pattern", "²:4"], capture_output=True, text=True, timeout=120, check=False)
    assert completed.returncode == 2 and completed.stdout == ""
    assert completed.stderr.strip().splitlines()[-1] == "Error: --pattern must look like 'N:M' (e.g. '2:4'), not '²:4'"
    assert "invalid literal" not in completed.stderr and not out.exists()
