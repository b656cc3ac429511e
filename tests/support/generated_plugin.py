"""A plugin written by ``prunereg new-plugin``, installed for real (non-editable) and run against its own tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``args`` with ``env`` added, asserting that it succeeds."""
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env={**os.environ, **env})
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


def install_and_test(tmp_path: Path, name: str, kind: str) -> tuple[dict[str, dict[str, Any]], str]:
    """``new-plugin NAME --kind KIND``, installed: ``prunereg list --kind KIND`` by name, and pytest's output."""
    bin_dir = Path(sys.executable).parent
    source, site = tmp_path / "source", tmp_path / "site"
    run([str(bin_dir / "prunereg"), "new-plugin", name, str(source), "--kind", kind], tmp_path)
    run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
         "--target", str(site), str(source)], tmp_path)  # fmt: skip
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    listed = run([str(bin_dir / "prunereg"), "list", "--json", "--kind", kind], tmp_path, PYTHONPATH=path)
    tests = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(source)], tmp_path, PYTHONPATH=path
    )
    return {row["name"]: row for row in json.loads(listed.stdout)}, tests.stdout
