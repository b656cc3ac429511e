"""``prunereg --help`` sends someone who wants a smaller, faster model to ``slim`` and ``shrink`` first."""

from __future__ import annotations

from click.testing import CliRunner

from prunereg._cli import main


def test_the_group_help_names_slim_and_shrink_before_the_masks() -> None:
    shown = CliRunner().invoke(main, ["--help"])
    assert shown.exit_code == 0, shown.output
    description = shown.output.split("Options:")[0]
    assert "smaller and faster" in description
    for command in ("slim", "shrink", "oneshot", "prune"):
        assert f" {command} " in description, description
    assert description.index(" slim ") < description.index(" shrink ") < description.index(" oneshot")
