"""Plugin discovery: entry points in the ``prunereg`` group, loaded once, each in isolation.

Load order is deterministic: the built-ins (entry points of prunereg's own
distribution) first, then the other distributions sorted by their normalized
name, each distribution's entry points sorted by name; methods registered
in-process with :func:`prunereg.register` come after all of them. When two
plugins register one name, the first in this order keeps it.

Each plugin is loaded on its own: one that fails to import, that defines no
valid hook, or whose hook raises (``sys.exit()``, ``SystemExit`` and
``KeyboardInterrupt`` included) is rolled back (none of its methods stay
registered), recorded with status ``error`` and reported; the others load as if
it were not there. What a plugin prints goes to stderr, never to stdout. A
plugin may also call :func:`prunereg.register` while it loads (at import or in
its hook): the method is its own, as if passed to ``register``. Code that runs
while plugins load (a hook calling :func:`prunereg.list_methods`, say) sees
the methods of the plugins loaded so far. Environment switches, read when the
registry loads:

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

import functools
import os
import re
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pluggy

from prunereg._plugins import hookspec
from prunereg._plugins.registry import PluginError, PluginWarning, Register, Registry, untaken_argument

BUILTIN_DISTRIBUTION = "prunereg"

_lock = threading.RLock()
_registry: Registry | None = None
_reported = False


class _Loading(threading.local):
    """The registry being filled and the plugin being loaded into it, in this thread, if any."""

    registry: Registry | None = None
    plugin: str | None = None


_loading = _Loading()

_resuming: dict[str, str] = {}
"""Plugin modules whose own import was under way when plugins loaded, by module name: their plugin names.

That happens when the user imports a plugin module that calls
:func:`prunereg.register` at import before prunereg has loaded its plugins:
the registrations arrive when the import resumes, and belong to that plugin.
"""


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
    every call raises :class:`PluginError` while there are any. Called while
    plugins load, it returns the registry as loaded so far, without reporting.
    """
    global _reported
    with _lock:
        if _loading.registry is not None:
            return _loading.registry
        current = loaded_registry()
        if current.strict and current.problems:
            raise PluginError("\n".join(current.problems))
        if not _reported:
            _reported = True
            for problem in current.problems:
                warnings.warn(problem, PluginWarning, stacklevel=3)
    return current


_Method = TypeVar("_Method")


def configured_method(
    method: str | _Method, contract: type[_Method], engine: str, options: dict[str, Any]
) -> tuple[_Method, str]:
    """``method`` (a registered name or an instance of ``contract``) configured with ``options``, and its name.

    What every engine that runs one kind of method does first; each wrong input is a one-line TypeError:
    options beside an instance, neither name nor instance, a name of another kind (the kind's installed names
    listed), an option the class does not take.
    """
    if isinstance(method, contract):
        if options:
            raise TypeError(f"method options {sorted(options)} need a method name, not a configured instance")
        return method, type(method).__name__
    if not isinstance(method, str):
        raise TypeError(
            f"method must be a registered name or a {contract.__name__} instance, not {type(method).__name__}"
        )
    kind = getattr(contract, "PRUNING_TYPE", "?")
    cls = registry().resolve(method)
    if not (isinstance(cls, type) and issubclass(cls, contract)):
        raise TypeError(
            f"{method!r} is a {getattr(cls, 'PRUNING_TYPE', '?')} method; {engine} needs one of kind {kind} "
            f"({', '.join(registry().names(kind)) or 'none installed'})"
        )
    untaken = untaken_argument(cls, options)
    if untaken is not None:
        raise TypeError(f"method {method!r} {untaken}")
    return cls(**options), method


def loaded_registry() -> Registry:
    """The process-wide registry without reporting its problems (the CLI reports them itself)."""
    global _registry
    with _lock:
        if _loading.registry is not None:
            return _loading.registry
        if _registry is None:
            _registry = load(entry_points(), Settings.from_env())
        return _registry


def reset() -> None:
    """Forget the loaded registry, so the next call loads plugins again (for tests)."""
    global _registry, _reported
    with _lock:
        _registry = None
        _reported = False
        _resuming.clear()


def register_local(cls: type, name: str, *, kind: str, summary: str, replace: bool) -> None:
    """The engine of :func:`prunereg.register`: in-process, or for the plugin whose import is running."""
    with _lock:
        if _loading.registry is not None and _loading.plugin is not None:
            _loading.registry.register(_loading.plugin, name, cls, kind=kind, summary=summary, replace=replace)
            return
        current = registry()
        plugin = _resuming_plugin()
        if plugin is not None:
            current.register(plugin, name, cls, kind=kind, summary=summary, replace=replace)
        else:
            current.register_local(cls, name, kind=kind, summary=summary, replace=replace)


def entry_points() -> list[Any]:
    """The ``prunereg`` entry points of every installed distribution, each once."""
    from importlib_metadata import entry_points as _entry_points

    found: dict[tuple[str, str], Any] = {}
    for point in _entry_points(group=hookspec.PROJECT_NAME):
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
        package, version = (dist.name, dist.version) if dist else (None, None)
        names = {_normalize(point.name), _normalize(package or "")}
        if names & settings.block:
            status = "blocked"
        elif _selected(settings, names, _distribution(point) == BUILTIN_DISTRIBUTION):
            status = "loaded"
        else:
            status = "disabled"
        if result.add_plugin(point.name, package, version, status=status) and status == "loaded":
            with _loading_into(result, point.name):
                result.load_plugin(point.name, functools.partial(_run_plugin, result, point))
    if settings.allow:
        known = {_normalize(n) for p in result.plugins.values() for n in (p.name, p.package or "")}
        for name in sorted(settings.allow - known):
            result.report(
                f"PRUNEREG_PLUGINS names {name!r}, but no installed plugin or "
                "distribution has that name (see `prunereg plugins`)"
            )
    return result


@contextmanager
def _loading_into(result: Registry, plugin: str) -> Iterator[None]:
    previous = (_loading.registry, _loading.plugin)
    _loading.registry, _loading.plugin = result, plugin
    try:
        yield
    finally:
        _loading.registry, _loading.plugin = previous


def _run_plugin(result: Registry, point: Any, register: Register) -> None:
    """Import one plugin and call its hook with ``register``."""
    module = point.load()
    if getattr(getattr(module, "__spec__", None), "_initializing", False):  # importlib's mark of a running import
        _resuming[module.__name__] = point.name
        return
    manager = pluggy.PluginManager(hookspec.PROJECT_NAME)
    manager.add_hookspecs(hookspec)
    manager.register(module, name=point.name)
    manager.check_pending()
    if manager.hook.prunereg_register_methods.get_hookimpls():
        manager.hook.prunereg_register_methods(register=register)
    elif not result.plugins[point.name].methods:  # registering with prunereg.register at import is fine too
        raise LookupError(
            f"{getattr(module, '__name__', module)!r} defines no prunereg_register_methods "
            "hook marked with @prunereg.hookimpl"
        )


def _resuming_plugin() -> str | None:
    """The plugin whose module's import is running further up the call stack, if any."""
    frame = sys._getframe(1) if _resuming else None
    while frame is not None:
        plugin = _resuming.get(frame.f_globals.get("__name__", ""))
        if plugin is not None:
            return plugin
        frame = frame.f_back
    return None


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
