"""`prunereg new-plugin NAME --kind shrink`: a shrink-method package that installs and passes its own tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from prunereg._cli import main
from tests.support.generated_plugin import install_and_test


def test_the_shrink_template_writes_a_shrink_method_with_the_packaging(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["new-plugin", "demo", str(tmp_path / "demo"), "--kind", "shrink"])
    assert result.exit_code == 0, result.output
    method = (tmp_path / "demo" / "prunereg_demo" / "method.py").read_text()
    assert "class DemoPruning(prunereg.ShrinkMethod):" in method
    assert 'kind="shrink"' in (tmp_path / "demo" / "prunereg_demo" / "__init__.py").read_text()
    assert 'demo = "prunereg_demo"' in (tmp_path / "demo" / "pyproject.toml").read_text()
    assert "check_shrink_method" in (tmp_path / "demo" / "tests" / "test_demo.py").read_text()


def test_the_info_command_says_shrink_runs_a_shrink_method() -> None:
    result = CliRunner().invoke(main, ["info", "flap", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["runs_with"] == ["shrink"]


@pytest.mark.slow
def test_a_generated_shrink_plugin_installs_registers_and_passes_its_own_tests(tmp_path: Path) -> None:
    rows, output = install_and_test(tmp_path, "demo-shrink", "shrink")
    assert rows["demo_shrink"]["package"] == "prunereg-demo-shrink"
    assert rows["demo_shrink"]["target"] == "prunereg_demo_shrink.method:DemoShrinkPruning"
    assert "4 passed" in output
