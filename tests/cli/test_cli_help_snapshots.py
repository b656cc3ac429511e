"""``prunereg --help`` and the model-folder commands' help, compared with the committed snapshots.

Any change to what these commands print for ``--help`` (a flag, its text, the
order, the examples) shows up here as a diff, so that ``oneshot``, ``shrink``
and ``slim`` drifting apart is seen in review. The help is rendered as on an
80-column terminal whatever the terminal running the tests. After a
deliberate change, rewrite the snapshots and commit them with it::

    python tests/cli/test_cli_help_snapshots.py --update
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from prunereg._cli import main

SNAPSHOTS = Path(__file__).resolve().with_name("snapshots")
COMMANDS = ("prunereg", "oneshot", "shrink", "slim")  # a snapshot each, named after the command
COLUMNS = 80
UPDATE = "python tests/cli/test_cli_help_snapshots.py --update"


def _args(command: str) -> list[str]:
    return [*([] if command == "prunereg" else [command]), "--help"]


def _typed(command: str) -> str:
    return " ".join(["prunereg", *_args(command)])


def rendered_help(command: str) -> str:
    """What ``prunereg [COMMAND] --help`` prints on a terminal of :data:`COLUMNS` columns.

    click wraps the help at the terminal's width less 2 (its margin); the width
    is set here, so that neither ``COLUMNS`` nor the terminal running the tests
    changes the text.
    """
    result = CliRunner().invoke(main, _args(command), prog_name="prunereg", terminal_width=COLUMNS - 2)
    assert result.exit_code == 0, result.output
    return result.output


def snapshot(command: str) -> Path:
    return SNAPSHOTS / f"{command}.txt"


def differences(command: str, shown: str) -> str:
    """A unified diff from the snapshot to ``shown``, and how to accept the change; empty when they agree."""
    path = snapshot(command)
    committed = path.read_text(encoding="utf-8") if path.exists() else ""
    if committed == shown:
        return ""
    diff = difflib.unified_diff(
        committed.splitlines(keepends=True),
        shown.splitlines(keepends=True),
        fromfile=path.relative_to(SNAPSHOTS.parents[2]).as_posix(),
        tofile=_typed(command),
    )
    return (
        f"`{_typed(command)}` differs from its snapshot; if the change is meant, run `{UPDATE}` "
        f"and commit the snapshot:\n{''.join(diff)}"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_the_help_is_the_committed_snapshot(command: str) -> None:
    found = differences(command, rendered_help(command))
    if found:
        pytest.fail(found, pytrace=False)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_real_80_column_terminal_prints_the_snapshot(command: str) -> None:
    script = Path(sys.executable).with_name("prunereg")
    environment = {**os.environ, "COLUMNS": str(COLUMNS)}
    done = subprocess.run(
        [str(script), *_args(command)], capture_output=True, text=True, env=environment, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found = differences(command, done.stdout)
    if found:
        pytest.fail(found, pytrace=False)


@pytest.mark.parametrize("columns", ["40", "200"])
def test_the_rendered_help_does_not_follow_the_terminal_width(monkeypatch: pytest.MonkeyPatch, columns: str) -> None:
    """The snapshot test holds in any terminal: the ``COLUMNS`` the suite runs under changes nothing."""
    monkeypatch.setenv("COLUMNS", columns)
    assert [command for command in COMMANDS if differences(command, rendered_help(command))] == []


def update() -> None:
    """Rewrite every snapshot from the installed prunereg's help."""
    SNAPSHOTS.mkdir(exist_ok=True)
    for command in COMMANDS:
        shown = rendered_help(command)
        if snapshot(command).exists() and snapshot(command).read_text(encoding="utf-8") == shown:
            continue
        snapshot(command).write_text(shown, encoding="utf-8")
        print(f"wrote {snapshot(command)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: {UPDATE}")
    update()
