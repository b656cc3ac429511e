"""What users install: every package typed and checked."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mypy, a dev dependency, brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
_NOT_SHIPPED = ("__pycache__", "*.pyc", "*.pyo")


def top_level_packages() -> dict[str, Path]:
    """The top-level packages setuptools finds (``[tool.setuptools.packages.find]``), by import name."""
    found = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    names = [name for name in found["include"] if "*" not in name]
    packages = {
        name: ROOT / where / name for where in found["where"] for name in names if (ROOT / where / name).is_dir()
    }
    assert sorted(packages) == sorted(names), f"packages.find names packages that do not exist: {names}"
    return packages


def shipped_files(name: str, folder: Path) -> list[str]:
    """Every file of a package's source folder, as its path inside the wheel."""
    ignored = shutil.ignore_patterns(*_NOT_SHIPPED)
    files = []
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if path.is_file() and not any(ignored(str(path.parent), [part]) for part in parts):
            files.append("/".join((name, *parts)))
    return files


@pytest.mark.parametrize("name", sorted(top_level_packages()))
def test_every_package_is_typed_checked_and_layered(name: str) -> None:
    folder = top_level_packages()[name]
    tool = PYPROJECT["tool"]
    assert (folder / "py.typed").is_file(), f"{name} has no py.typed: type checkers would ignore its hints"
    assert "py.typed" in tool["setuptools"]["package-data"].get(name, []), f"{name}'s py.typed is not package data"
    assert str(folder.relative_to(ROOT)) in tool["mypy"]["files"], f"mypy does not check {name}"
    assert name in tool["ruff"]["lint"]["isort"]["known-first-party"], f"isort does not know {name} is ours"
    assert name in tool["importlinter"]["root_packages"], f"lint-imports does not check {name}"
