"""`prunereg new-plugin NAME --kind shrink`: a shrink-method package that installs and passes its own tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from prunereg._cli import main


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env={**os.environ, **env})
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


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
    bin_dir = Path(sys.executable).parent
    source, site = tmp_path / "source", tmp_path / "site"
    run([str(bin_dir / "prunereg"), "new-plugin", "demo-shrink", str(source), "--kind", "shrink"], tmp_path)
    run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
         "--target", str(site), str(source)], tmp_path)  # fmt: skip
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    listed = run([str(bin_dir / "prunereg"), "list", "--json", "--kind", "shrink"], tmp_path, PYTHONPATH=path)
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["demo_shrink"]["package"] == "prunereg-demo-shrink"
    assert rows["demo_shrink"]["target"] == "prunereg_demo_shrink.method:DemoShrinkPruning"
    tests = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(source)], tmp_path, PYTHONPATH=path
    )
    assert "4 passed" in tests.stdout
