"""prunereg: weight pruning for PyTorch, with methods found by name through plugins.

``import prunereg`` stays light: torch and the plugins are imported the first
time a name that needs them is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from prunereg._hookspec import hookimpl
from prunereg._registry import MethodInfo, PluginInfo, PluginWarning, UnknownMethodError

if TYPE_CHECKING:
    from prunereg._container import PruningContainer
    from prunereg._global import global_unstructured
    from prunereg._method import BasePruningMethod
    from prunereg._reparam import is_pruned, remove
    from prunereg._serialization import safe_globals
    from prunereg._state_dict import load_state_dict

__version__ = "0.1.0"

__all__ = [
    "BasePruningMethod",
    "MethodInfo",
    "PluginInfo",
    "PluginWarning",
    "PruningContainer",
    "UnknownMethodError",
    "get",
    "global_unstructured",
    "hookimpl",
    "info",
    "is_pruned",
    "list_methods",
    "load_state_dict",
    "remove",
    "safe_globals",
]

_LAZY = {
    "BasePruningMethod": "prunereg._method",
    "PruningContainer": "prunereg._container",
    "global_unstructured": "prunereg._global",
    "is_pruned": "prunereg._reparam",
    "remove": "prunereg._reparam",
    "safe_globals": "prunereg._serialization",
    "load_state_dict": "prunereg._state_dict",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'prunereg' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def get(name: str) -> type[BasePruningMethod]:
    """The pruning-method class registered as ``name`` (or ``plugin:name``).

    >>> prunereg.get("ln_structured")(amount=0.3, n=2, dim=0)

    Raises :class:`UnknownMethodError` (a ``LookupError``) naming the closest matches.
    """
    from prunereg._plugins import registry

    return registry().resolve(name)


def info(name: str) -> MethodInfo:
    """What the registry knows of ``name`` without importing its class: kind, summary, package."""
    from prunereg._plugins import registry

    return registry().info(name)


def list_methods() -> list[str]:
    """The names of all registered pruning methods, sorted."""
    from prunereg._plugins import registry

    return registry().names()
