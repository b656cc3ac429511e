"""`prunereg new-plugin NAME --kind calibrated`: a calibrated-method package that installs and passes its tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from prunereg._cli import main
from tests.support.generated_plugin import install_and_test


def test_the_calibrated_template_replaces_the_method_files_and_keeps_the_packaging(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["new-plugin", "demo", str(tmp_path / "demo"), "--kind", "calibrated"])
    assert result.exit_code == 0, result.output
    method = (tmp_path / "demo" / "prunereg_demo" / "method.py").read_text()
    assert "class DemoPruning(prunereg.CalibratedMethod):" in method
    assert 'kind="calibrated"' in (tmp_path / "demo" / "prunereg_demo" / "__init__.py").read_text()
    assert 'demo = "prunereg_demo"' in (tmp_path / "demo" / "pyproject.toml").read_text()
    assert "check_calibrated_method" in (tmp_path / "demo" / "tests" / "test_demo.py").read_text()
    refused = CliRunner().invoke(main, ["new-plugin", "other", str(tmp_path / "other"), "--kind", "global"])
    assert refused.exit_code == 2 and not (tmp_path / "other").exists()


@pytest.mark.slow
def test_a_generated_calibrated_plugin_installs_registers_and_passes_its_own_tests(tmp_path: Path) -> None:
    rows, output = install_and_test(tmp_path, "demo-calibrated", "calibrated")
    assert rows["demo_calibrated"]["package"] == "prunereg-demo-calibrated"
    assert rows["demo_calibrated"]["target"] == "prunereg_demo_calibrated.method:DemoCalibratedPruning"
    assert "4 passed" in output
