"""Plugin discovery: entry points in the ``prunereg`` group, loaded once, each in isolation.

Order is deterministic: prunereg's own built-ins first, then the other
distributions sorted by name, each distribution's entry points by name. A
plugin that fails to import or whose hook raises is reported (``PluginWarning``
and an ``error`` status) and skipped; it never breaks the others.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable
from typing import Any

import pluggy

from prunereg import _hookspec
from prunereg._registry import MethodInfo, PluginInfo, PluginWarning, Registry, target_name

BUILTIN_DISTRIBUTION = "prunereg"
KINDS = ("unstructured", "structured", "global")

_lock = threading.Lock()
_registry: Registry | None = None


def registry() -> Registry:
    """The process-wide registry, loading every plugin on first call."""
    global _registry
    if _registry is None:
        with _lock:
            if _registry is None:
                _registry = load(entry_points())
    return _registry


def reset() -> None:
    """Forget the loaded registry, so the next call loads plugins again (for tests)."""
    global _registry
    with _lock:
        _registry = None


def entry_points() -> list[Any]:
    """The ``prunereg`` entry points of every installed distribution, in load order."""
    from importlib_metadata import entry_points as _entry_points

    found = {(ep.dist.name if ep.dist else "", ep.name): ep for ep in _entry_points(group=_hookspec.PROJECT_NAME)}
    return [found[key] for key in sorted(found, key=lambda k: (k[0] != BUILTIN_DISTRIBUTION, k[0].lower(), k[1]))]


def load(points: Iterable[Any]) -> Registry:
    """Build a registry from ``points`` (entry-point-like: ``name``, ``dist``, ``load()``)."""
    manager = pluggy.PluginManager(_hookspec.PROJECT_NAME)
    manager.add_hookspecs(_hookspec)
    result = Registry()
    for point in points:
        dist = getattr(point, "dist", None)
        plugin = PluginInfo(
            name=point.name,
            package=dist.name if dist else None,
            version=dist.version if dist else None,
        )
        result.plugins[plugin.name] = plugin
        try:
            module = point.load()
            manager.register(module, name=plugin.name)
            for impl in manager.hook.prunereg_register_methods.get_hookimpls():
                if impl.plugin is module:
                    impl.function(register=_registrar(result, plugin))
        except Exception as error:  # a plugin must never break the others
            _fail(plugin, error)
    return result


def _registrar(result: Registry, plugin: PluginInfo) -> _hookspec.Register:
    def register(name: str, target: object, *, kind: str, summary: str, replace: bool = False) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        info = MethodInfo(
            name=name,
            kind=kind,
            summary=summary,
            plugin=plugin.name,
            package=plugin.package,
            version=plugin.version,
            target=target_name(target),
        )
        conflict = result.add(info, target, replace=replace)
        if conflict is None:
            plugin.methods.append(name)
        else:
            plugin.status = "conflict"
            plugin.error = conflict
            warnings.warn(conflict, PluginWarning, stacklevel=2)

    return register


def _fail(plugin: PluginInfo, error: BaseException) -> None:
    plugin.status = "error"
    plugin.error = f"{type(error).__name__}: {error}"
    warnings.warn(
        f"prunereg plugin {plugin.name!r} ({plugin.package} {plugin.version}) failed to load "
        f"and was skipped: {plugin.error}",
        PluginWarning,
        stacklevel=3,
    )
