"""`prunereg new-plugin NAME --kind importance`: an importance package that installs and passes its own tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from prunereg._cli import main
from tests.support.generated_plugin import install_and_test


def test_the_importance_template_writes_an_importance_with_the_packaging(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["new-plugin", "demo", str(tmp_path / "demo"), "--kind", "importance"])
    assert result.exit_code == 0, result.output
    method = (tmp_path / "demo" / "prunereg_demo" / "method.py").read_text()
    assert "class DemoImportance(prunereg.Importance):" in method and "unit_sums" in method
    assert 'kind="importance"' in (tmp_path / "demo" / "prunereg_demo" / "__init__.py").read_text()
    assert "check_importance" in (tmp_path / "demo" / "tests" / "test_demo.py").read_text()


@pytest.mark.slow
def test_a_generated_importance_plugin_installs_registers_and_passes_its_own_tests(tmp_path: Path) -> None:
    rows, output = install_and_test(tmp_path, "demo-rank", "importance")
    assert rows["demo_rank"]["target"] == "prunereg_demo_rank.method:DemoRankImportance"
    assert "3 passed" in output
