"""The layering of docs/architecture.md: import-linter's contracts, no import cycle, plugins on the public API.

grimp (import-linter's graph) reads every import: at the top of a module,
inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")
importlinter_cli = pytest.importorskip("importlinter.cli")

ROOT = Path(__file__).resolve().parents[2]
CONTRIB_SOURCES = sorted(ROOT.glob("contrib/*/src"))
PUBLIC = {"prunereg", "prunereg.toolkit", "prunereg.testing"}


def test_import_linter_contracts_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    with loggers_kept():
        assert lint_imports() == 0


def lint_imports() -> int:
    return int(importlinter_cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True))


@contextlib.contextmanager
def loggers_kept() -> Iterator[None]:
    """Every logger as it was: lint_imports configures logging with dictConfig, which disables every existing logger.

    Left so, torch's loggers stayed disabled for the rest of the process, and a later test in it (one that checks
    prunereg leaves torch's logging as it found it) failed when the workers of ``-n`` ran it after this one.
    """
    loggers = [logging.root, *(logger for logger in logging.root.manager.loggerDict.values()
                                if isinstance(logger, logging.Logger))]  # fmt: skip
    saved = [(logger, logger.disabled, logger.level, list(logger.handlers), logger.propagate) for logger in loggers]
    try:
        yield
    finally:
        for logger, disabled, level, handlers, propagate in saved:
            logger.disabled, logger.propagate, logger.handlers[:] = disabled, propagate, handlers
            logger.setLevel(level)


def test_lint_imports_leaves_the_loggers_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    torch_logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    assert not torch_logger.disabled
    monkeypatch.chdir(ROOT)
    with loggers_kept():
        lint_imports()
        assert torch_logger.disabled  # what dictConfig does
    assert not torch_logger.disabled and torch_logger.isEnabledFor(logging.WARNING)


def test_no_import_cycle_anywhere() -> None:
    graph = grimp.build_graph("prunereg", "prunereg_builtins", "prunereg_llm", cache_dir=None)
    cycles = [
        [importer, *chain]
        for importer in sorted(graph.modules)
        for imported in sorted(graph.find_modules_directly_imported_by(importer))
        if (chain := graph.find_shortest_chain(imported, importer)) is not None
    ]
    assert not cycles, f"import cycle: {' -> '.join(cycles[0])}"


@pytest.mark.parametrize("source", CONTRIB_SOURCES, ids=lambda path: path.parent.name)
def test_contrib_plugins_import_only_public_modules(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(source))
    packages = [path.name for path in source.iterdir() if (path / "__init__.py").exists()]
    graph = grimp.build_graph(*packages, "prunereg", cache_dir=None)
    private = sorted(
        (importer, imported)
        for package in packages
        for importer in graph.find_descendants(package) | {package}
        for imported in graph.find_modules_directly_imported_by(importer)
        if imported.split(".")[0] == "prunereg" and imported not in PUBLIC
    )
    assert not private, f"{private[0][0]} imports the private module {private[0][1]}"


CORE_WITHOUT_BUILTINS = """
import ast
import sys
import torch
from torch import nn
import prunereg
from prunereg import toolkit


@prunereg.register("halve", summary="Prune the smaller half")
class Halve(prunereg.BasePruningMethod):
    PRUNING_TYPE = "unstructured"
    RANKED_BY = "magnitude"

    def __init__(self, amount=0.5):
        self.amount = amount

    def compute_mask(self, t, default_mask):
        return toolkit.prune_lowest(t, toolkit.count_to_prune(self.amount, t.numel()), default_mask, magnitude=True)


net = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2))
prunereg.global_unstructured([(net[0], "weight"), (net[1], "weight")], prunereg.get("halve"))
prunereg.apply_masks(net, {"0.bias": torch.tensor([1.0, 0.0, 1.0, 1.0])})
assert int((net[0].bias == 0).sum()) >= 1 and prunereg.is_pruned(net)
assert "prunereg_builtins" not in sys.modules, "the core imported the built-in plugin"
"""


def test_the_core_prunes_without_the_builtin_plugin(tmp_path: Path) -> None:
    """Global pruning and apply_masks need no built-in method: blocked, the plugin is never imported."""
    import os
    import subprocess

    environment = {**os.environ, "PRUNEREG_BLOCK_PLUGINS": "builtins", "PRUNEREG_STRICT_PLUGINS": "0"}
    script = tmp_path / "core_only.py"
    script.write_text(CORE_WITHOUT_BUILTINS)
    result = subprocess.run([sys.executable, str(script)], env=environment, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _private_names_from_other_packages(root: Path) -> list[str]:
    """``from prunereg._a.b import _name`` in a module outside ``prunereg._a``: each as "importer: module._name".

    A package is ``prunereg._a`` (a top-level module is one of its own); importing
    a private *module* (``from prunereg import _legacy``) is not importing a name.
    """
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        importer = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "prunereg"):
                continue
            if node.module.split(".")[:2] == importer.split(".")[:2]:
                continue
            source = root.parent.joinpath(*node.module.split("."))
            found += [
                f"{importer}: {node.module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
                and not (source / f"{alias.name}.py").exists() and not (source / alias.name).is_dir()
            ]  # fmt: skip
    return found


def test_no_package_imports_a_private_name_of_another() -> None:
    """The engines share the runtime's public names, never each other's privates (docs/architecture.md)."""
    assert _private_names_from_other_packages(ROOT / "prunereg") == []
