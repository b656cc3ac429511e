"""Plugin discovery: entry points in the ``prunereg`` group, loaded once, each in isolation.

Load order is deterministic: the built-ins (entry points of prunereg's own
distribution) first, then the other distributions sorted by their normalized
name, each distribution's entry points sorted by name; methods registered
in-process with :func:`prunereg.register` come after all of them. When two
plugins register one name, the first in this order keeps it.

Each plugin is loaded on its own: one that fails to import, that defines no
valid hook, or whose hook raises is rolled back (none of its methods stay
registered), recorded with status ``error`` and reported; the others load as if
it were not there. Environment switches, read when the registry loads:

- ``PRUNEREG_DISABLE_PLUGIN_AUTOLOAD=1``: load only the built-ins (and the
  plugins named in ``PRUNEREG_PLUGINS``, if set).
- ``PRUNEREG_PLUGINS=a,b``: load only these plugins besides the built-ins; a
  name that no installed plugin has is reported.
- ``PRUNEREG_BLOCK_PLUGINS=a,b``: never load these (status ``blocked``).
- ``PRUNEREG_STRICT_PLUGINS=1``: raise :class:`PluginError` instead of warning.

Plugins are named by entry-point name or by distribution name (``nm`` or
``prunereg-nm``).
"""

from __future__ import annotations

import os
import re
import threading
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from prunereg import _hookspec
from prunereg._registry import (
    LOCAL_PLUGIN,
    MethodInfo,
    PluginError,
    PluginInfo,
    PluginWarning,
    Registry,
    describe,
    target_name,
    validate_registration,
)

BUILTIN_DISTRIBUTION = "prunereg"

_lock = threading.RLock()
_registry: Registry | None = None
_reported = False


@dataclass(frozen=True)
class Settings:
    """Which plugins to load and how to report problems, from the environment."""

    autoload: bool = True
    allow: frozenset[str] | None = None
    block: frozenset[str] = frozenset()
    strict: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        allow = env.get("PRUNEREG_PLUGINS")
        return cls(
            autoload=not _truthy(env.get("PRUNEREG_DISABLE_PLUGIN_AUTOLOAD")),
            allow=None if allow is None else _names(allow),
            block=_names(env.get("PRUNEREG_BLOCK_PLUGINS", "")),
            strict=_truthy(env.get("PRUNEREG_STRICT_PLUGINS")),
        )


def registry() -> Registry:
    """The process-wide registry, loading every plugin on the first call.

    Load problems are reported once, as :class:`PluginWarning`; in strict mode
    every call raises :class:`PluginError` while there are any.
    """
    global _reported
    with _lock:
        current = loaded_registry()
        if current.strict and current.problems:
            raise PluginError("\n".join(current.problems))
        if not _reported:
            _reported = True
            for problem in current.problems:
                warnings.warn(problem, PluginWarning, stacklevel=3)
    return current


def loaded_registry() -> Registry:
    """The process-wide registry without reporting its problems (the CLI reports them itself)."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = load(entry_points(), Settings.from_env())
        return _registry


def reset() -> None:
    """Forget the loaded registry, so the next call loads plugins again (for tests)."""
    global _registry, _reported
    with _lock:
        _registry = None
        _reported = False


def register_local(cls: type, name: str, *, kind: str, summary: str, replace: bool) -> None:
    """Register ``cls`` in the process-wide registry (the engine of :func:`prunereg.register`)."""
    with _lock:
        registry().register_local(cls, name, kind=kind, summary=summary, replace=replace)


def entry_points() -> list[Any]:
    """The ``prunereg`` entry points of every installed distribution, each once."""
    from importlib_metadata import entry_points as _entry_points

    found = {}
    for point in _entry_points(group=_hookspec.PROJECT_NAME):
        # A distribution found twice on sys.path (an editable install, say) counts once.
        found.setdefault((_distribution(point), point.name), point)
    return list(found.values())


def load(points: Iterable[Any], settings: Settings | None = None) -> Registry:
    """Build a registry from entry-point-like ``points`` (``name``, ``dist``, ``load()``)."""
    settings = settings or Settings()
    result = Registry(strict=settings.strict)
    ordered = sorted(points, key=lambda p: (_distribution(p) != BUILTIN_DISTRIBUTION, _distribution(p), p.name))
    for point in ordered:
        dist = getattr(point, "dist", None)
        plugin = PluginInfo(point.name, dist.name if dist else None, dist.version if dist else None)
        if plugin.name in result.plugins or plugin.name == LOCAL_PLUGIN:
            _duplicate_plugin_name(result, plugin)
            continue
        result.plugins[plugin.name] = plugin
        names = {_normalize(plugin.name), _normalize(plugin.package or "")}
        if names & settings.block:
            plugin.status = "blocked"
        elif not _selected(settings, names, _distribution(point) == BUILTIN_DISTRIBUTION):
            plugin.status = "disabled"
        else:
            _load_plugin(result, plugin, point)
    if settings.allow:
        known = {_normalize(n) for p in result.plugins.values() for n in (p.name, p.package or "")}
        for name in sorted(settings.allow - known):
            result.problems.append(
                f"prunereg: PRUNEREG_PLUGINS names {name!r}, but no installed plugin or "
                "distribution has that name (see `prunereg plugins`)"
            )
    return result


def _load_plugin(result: Registry, plugin: PluginInfo, point: Any) -> None:
    """Import one plugin and run its hook; on any failure undo what it registered."""
    snapshot = result.snapshot()
    conflicts: list[str] = []
    try:
        module = point.load()
        manager = pluggy.PluginManager(_hookspec.PROJECT_NAME)
        manager.add_hookspecs(_hookspec)
        manager.register(module, name=plugin.name)
        manager.check_pending()
        if not manager.hook.prunereg_register_methods.get_hookimpls():
            raise LookupError(
                f"{getattr(module, '__name__', module)!r} defines no prunereg_register_methods "
                "hook marked with @prunereg.hookimpl"
            )
        manager.hook.prunereg_register_methods(register=_registrar(result, plugin, conflicts))
    except Exception as error:  # a plugin must never break the others
        result.restore(snapshot)
        plugin.methods.clear()
        result.problems.append(plugin.record("error", f"failed to load and was skipped: {describe(error)}"))
        return
    for conflict in conflicts:
        result.problems.append(plugin.record("conflict", conflict))


def _registrar(result: Registry, plugin: PluginInfo, conflicts: list[str]) -> _hookspec.Register:
    def register(name: str, target: object, *, kind: str, summary: str, replace: bool = False) -> None:
        validate_registration(name, kind, summary)
        info = MethodInfo(name, kind, summary.strip(), plugin.name, plugin.package, plugin.version, target_name(target))
        conflict = result.add(info, target, replace=replace)
        if name not in plugin.methods:
            plugin.methods.append(name)
        if conflict is not None:
            conflicts.append(conflict)

    return register


def _duplicate_plugin_name(result: Registry, plugin: PluginInfo) -> None:
    holder = result.plugins.get(plugin.name)
    why = (
        f"the name is taken by {holder.label}" if holder else "the name is reserved for in-process registrations"
    )
    problem = f"was skipped: {why}; rename its entry point"
    plugin.status, plugin.error = "conflict", problem
    result.plugins[f"{plugin.name} ({plugin.package})"] = plugin
    result.problems.append(f"prunereg {plugin.label}: {problem}")


def _selected(settings: Settings, names: set[str], builtin: bool) -> bool:
    if builtin:
        return True
    if settings.allow is not None:
        return bool(names & settings.allow)
    return settings.autoload


def _distribution(point: Any) -> str:
    dist = getattr(point, "dist", None)
    return _normalize(dist.name) if dist else ""


def _normalize(name: str) -> str:
    """Distribution names compare like pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(value: str) -> frozenset[str]:
    return frozenset(_normalize(n.strip()) for n in value.split(",") if n.strip())


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")
