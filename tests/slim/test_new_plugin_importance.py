"""`prunereg new-plugin NAME --kind importance`: an importance package that installs and passes its own tests."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from prunereg._cli import main
from tests.shrink.test_new_plugin_shrink import run


def test_the_importance_template_writes_an_importance_with_the_packaging(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["new-plugin", "demo", str(tmp_path / "demo"), "--kind", "importance"])
    assert result.exit_code == 0, result.output
    method = (tmp_path / "demo" / "prunereg_demo" / "method.py").read_text()
    assert "class DemoImportance(prunereg.Importance):" in method and "unit_sums" in method
    assert 'kind="importance"' in (tmp_path / "demo" / "prunereg_demo" / "__init__.py").read_text()
    assert "check_importance" in (tmp_path / "demo" / "tests" / "test_demo.py").read_text()


@pytest.mark.slow
def test_a_generated_importance_plugin_installs_registers_and_passes_its_own_tests(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    source, site = tmp_path / "source", tmp_path / "site"
    run([str(bin_dir / "prunereg"), "new-plugin", "demo-rank", str(source), "--kind", "importance"], tmp_path)
    run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
         "--target", str(site), str(source)], tmp_path)  # fmt: skip
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    listed = run([str(bin_dir / "prunereg"), "list", "--json", "--kind", "importance"], tmp_path, PYTHONPATH=path)
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["demo_rank"]["target"] == "prunereg_demo_rank.method:DemoRankImportance"
    tests = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(source)], tmp_path, PYTHONPATH=path
    )
    assert "3 passed" in tests.stdout
