"""The module paths of prunereg 0.1, before its subsystems became subpackages, for pickles written then.

A whole pruned model saved with ``torch.save`` names its pruning hooks' classes
by module path (``prunereg._method.PruningContainer``). Those modules moved; a
finder on ``sys.meta_path`` hands ``pickle`` the new module under the old name,
and :func:`prunereg.safe_globals` allows the old names for ``weights_only``
loading. Nothing is imported until a pickle asks for one of these names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

# Old module -> new module, for every module that defined a class a pruned model pickles.
MOVED = {
    "prunereg._method": "prunereg._core.method",
    "prunereg._custom": "prunereg._core.custom",
    "prunereg._attention": "prunereg._core.attention",
    "prunereg._reparam": "prunereg._core.reparam",
}


def old_names(cls: type) -> list[str]:
    """The full names ``cls`` had in prunereg 0.1 (empty if it did not move)."""
    return [f"{old}.{cls.__qualname__}" for old, new in MOVED.items() if cls.__module__ == new]


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name as the module that now holds its code."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a placeholder; exec_module replaces it, so the real module keeps its own spec

    def exec_module(self, module: ModuleType) -> None:
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])


_FINDER = _MovedModules()


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``import prunereg`` does)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
