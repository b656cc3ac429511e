"""docs/reliability.md names real tests: every test it lists exists in the file it names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reliability.md"
_ITEM = re.compile(r"^- `((?:\w+/)*test_\w+\.py)`(?: \([^)]*\))?:\s(.*?)(?=^- |^#|^\S|\Z)", re.MULTILINE | re.DOTALL)


def listed_tests() -> dict[str, set[str]]:
    """Test function names by test file, from the page's bullet lists."""
    found: dict[str, set[str]] = {}
    for file_name, names in _ITEM.findall(PAGE.read_text()):
        found.setdefault(file_name, set()).update(re.findall(r"`(test_\w+)`", names))
    return found


def test_every_listed_test_exists() -> None:
    listed = listed_tests()
    assert len(listed) >= 7 and sum(map(len, listed.values())) >= 40
    for file_name, names in listed.items():
        tree = ast.parse((ROOT / "tests" / file_name).read_text())
        defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert names <= defined, f"{file_name} has no {sorted(names - defined)}"
