"""The recovery kind on the command line: `prunereg list --kind recovery`, `info`, `new-plugin --kind recovery`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from prunereg._cli import main
from tests.support.generated_plugins import install_generated_plugin

BUILT_INS = {"refit", "replace", "blockwise", "distill"}


def test_list_shows_the_built_in_recovery_methods_and_how_they_run() -> None:
    result = CliRunner().invoke(main, ["list", "--kind", "recovery", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {row["name"] for row in rows} == BUILT_INS
    assert {row["kind"] for row in rows} == {"recovery"}
    assert {row["runs_with"] for row in rows} == {"Python only (prunereg.recover)"}


def test_info_says_a_recovery_method_runs_from_python() -> None:
    result = CliRunner().invoke(main, ["info", "refit"])
    assert result.exit_code == 0, result.output
    assert "runs with: Python only (prunereg.recover)" in result.output
    assert "ridge: float = 0.0001" in result.output
    details = json.loads(CliRunner().invoke(main, ["info", "blockwise", "--json"]).stdout)
    assert details["runs_with"] == [] and details["kind"] == "recovery"


def test_the_recovery_template_writes_a_recovery_method_with_the_packaging(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["new-plugin", "demo", str(tmp_path / "demo"), "--kind", "recovery"])
    assert result.exit_code == 0, result.output
    method = (tmp_path / "demo" / "prunereg_demo" / "method.py").read_text()
    assert "class DemoPruning(prunereg.RecoveryMethod):" in method
    assert 'kind="recovery"' in (tmp_path / "demo" / "prunereg_demo" / "__init__.py").read_text()
    assert 'demo = "prunereg_demo"' in (tmp_path / "demo" / "pyproject.toml").read_text()
    assert "check_recovery_method" in (tmp_path / "demo" / "tests" / "test_demo.py").read_text()


@pytest.mark.slow
def test_a_generated_recovery_plugin_installs_registers_and_passes_its_own_tests(tmp_path: Path) -> None:
    rows, tests = install_generated_plugin("demo-recovery", "recovery", tmp_path)
    assert rows["demo_recovery"]["package"] == "prunereg-demo-recovery"
    assert rows["demo_recovery"]["target"] == "prunereg_demo_recovery.method:DemoRecoveryPruning"
    assert "3 passed" in tests
