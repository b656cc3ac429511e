"""`prunereg new-plugin` writes a package that installs (for real, not editable) and passes its own tests."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env={**os.environ, **env})
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.mark.slow
def test_a_generated_plugin_installs_registers_and_passes_its_own_tests(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    site = tmp_path / "site"
    written = run([str(bin_dir / "prunereg"), "new-plugin", "demo-kit"], tmp_path)
    # The command it prints must install the folder it wrote (issue 12), not ask the package index.
    install, listing, test = written.stdout.splitlines()[-1].split(" && ")
    assert (shlex.split(install), listing, shlex.split(test)) == (
        ["pip", "install", "./prunereg-demo-kit"],
        "prunereg list",
        ["python", "-m", "pytest", "./prunereg-demo-kit"],
    )
    # That command, with the interpreter under test, as a real wheel install with dist-info, into a folder of
    # its own (the venv stays untouched) and offline: a package-index lookup would fail here.
    run(
        [
            sys.executable,
            "-m",
            *shlex.split(install),
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--target",
            str(site),
        ],
        tmp_path,
    )
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))

    # Run from tmp_path, not from the source folder, so only the installed copy is importable.
    imported = run(
        [sys.executable, "-c", "import prunereg_demo_kit; print(prunereg_demo_kit.__file__)"], tmp_path, PYTHONPATH=path
    )
    assert Path(imported.stdout.strip()).is_relative_to(site)

    listed = run([str(bin_dir / "prunereg"), "list", "--json"], tmp_path, PYTHONPATH=path)
    assert {
        "name": "demo_kit",
        "kind": "unstructured",
        "summary": "Prune the amount fraction of entries of smallest absolute value",
        "plugin": "demo_kit",
        "package": "prunereg-demo-kit",
        "version": "0.1.0",
        "target": "prunereg_demo_kit.method:DemoKitPruning",
        "runs_with": "prune, prune --global",
    } in json.loads(listed.stdout)

    tests = run([sys.executable, *shlex.split(test)[1:], "-q", "-p", "no:cacheprovider"], tmp_path, PYTHONPATH=path)
    assert "4 passed" in tests.stdout
