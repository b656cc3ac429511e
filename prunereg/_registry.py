"""The method registry: names to method classes, filled by plugins, resolved lazily.

Nothing here imports torch or a plugin's implementation: a registration is a
name, a kind, a summary and a ``"module:Attr"`` target, imported on the first
:meth:`Registry.resolve`. Problems are recorded on the plugin that caused them
(:class:`PluginInfo`); how they are reported (warning or error) is up to the
caller, see :mod:`prunereg._plugins`.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

MASK_KINDS = ("unstructured", "structured", "global")
"""The kinds of mask methods (BasePruningMethod); "calibrated" methods run under prunereg.oneshot."""
KINDS = (*MASK_KINDS, "calibrated")
LOCAL_PLUGIN = "local"
"""The plugin name of methods registered in-process with :func:`prunereg.register`."""


class UnknownMethodError(LookupError):
    """No usable pruning method is registered under the name asked for."""


class PluginWarning(UserWarning):
    """A plugin could not be loaded, or one of its methods was set aside."""


class PluginError(RuntimeError):
    """A plugin could not be loaded, in strict mode (``PRUNEREG_STRICT_PLUGINS=1``)."""


@dataclass(frozen=True)
class MethodInfo:
    """What a plugin registered for one method; ``target`` is imported on first use."""

    name: str
    kind: str
    summary: str
    plugin: str
    package: str | None
    version: str | None
    target: str

    @property
    def qualified_name(self) -> str:
        """``plugin:name``, the name that reaches this registration even when another won the plain name."""
        return f"{self.plugin}:{self.name}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PluginInfo:
    """One plugin and how loading it went.

    ``status`` is ``loaded``, ``error`` (it failed to import, its hook raised,
    or a method's target failed to import), ``conflict`` (it lost a method name
    to an earlier plugin), ``blocked`` (named in ``PRUNEREG_BLOCK_PLUGINS``) or
    ``disabled`` (left out by ``PRUNEREG_DISABLE_PLUGIN_AUTOLOAD`` or
    ``PRUNEREG_PLUGINS``). ``methods`` lists the names it registered, each
    reachable as ``plugin:name``; ``error`` says what went wrong, if anything.
    """

    name: str
    package: str | None
    version: str | None
    status: str = "loaded"
    methods: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def label(self) -> str:
        """How messages name the plugin: its name, distribution and version."""
        origin = f"{self.package} {self.version}" if self.package else "no installed distribution"
        return f"plugin {self.name!r} ({origin})"

    def record(self, status: str, problem: str) -> str:
        """Note a problem; ``error`` outranks ``conflict``. Returns the message to report."""
        if self.status != "error":
            self.status = status
        self.error = problem if self.error is None else f"{self.error}; {problem}"
        return f"prunereg {self.label}: {problem}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Registry:
    """Methods by name, and the plugins they came from.

    Two registrations of one name are never resolved silently: the first one
    wins, and the later one is reported as a conflict on its plugin. A
    registration with ``replace=True`` takes the name over on purpose, once: a
    second ``replace=True`` for the same name is a conflict again.
    ``plugin:name`` always reaches one plugin's own registration.
    """

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self.methods: dict[str, MethodInfo] = {}
        self.qualified: dict[str, MethodInfo] = {}
        self.plugins: dict[str, PluginInfo] = {}
        self.problems: list[str] = []
        """Messages for everything that went wrong while loading, in load order."""
        self._replaced: set[str] = set()
        self._objects: dict[str, object] = {}
        self._classes: dict[str, type] = {}
        self._failures: dict[str, str] = {}

    # -- filling -----------------------------------------------------------------

    def add(self, info: MethodInfo, target: object = None, *, replace: bool = False) -> str | None:
        """Register ``info`` (``target`` is the class itself when it was given as one).

        Returns a description of the clash when the name stays with an earlier
        registration, and None when ``info`` now holds it.
        """
        key = info.qualified_name
        if key in self.qualified and not replace:
            return f"registers {info.name!r} twice; the first registration is kept"
        self.qualified[key] = info
        self._forget(key)
        if target is not None and not isinstance(target, str):
            self._objects[key] = target
        holder = self.methods.get(info.name)
        if holder is not None and holder.plugin != info.plugin and (not replace or info.name in self._replaced):
            how = "took it over with replace=True" if info.name in self._replaced else "registered it first"
            return (
                f"method {info.name!r} conflicts with {_origin(holder)}, which {how}: "
                f"{info.name!r} stays {holder.plugin!r}'s; reach this one as {key!r}"
                + ("" if replace else ", or register it with replace=True to take the name over")
            )
        if holder is not None and replace and holder.plugin != info.plugin:
            self._replaced.add(info.name)
        self.methods[info.name] = info
        return None

    def register_local(self, cls: type, name: str, *, kind: str, summary: str, replace: bool) -> None:
        """Register ``cls`` in-process, as plugin ``local``: see :func:`prunereg.register`.

        Registering a name again from ``local`` redefines it (a notebook cell run
        twice); taking a name from another plugin needs ``replace=True``, else
        ``ValueError``. A class registered in-process is checked at once.
        """
        validate_registration(name, kind, summary)
        info = MethodInfo(name, kind, summary, LOCAL_PLUGIN, None, None, target_name(cls))
        _check_method_class(cls, info)
        holder = self.methods.get(name)
        if holder is not None and holder.plugin != LOCAL_PLUGIN and not replace:
            raise ValueError(
                f"a pruning method named {name!r} is already registered by {_origin(holder)}; "
                "pass replace=True to take the name over, or choose another name"
            )
        plugin = self.plugins.setdefault(LOCAL_PLUGIN, PluginInfo(LOCAL_PLUGIN, None, None))
        if name not in plugin.methods:
            plugin.methods.append(name)
        self._replaced.discard(name)
        self.add(info, cls, replace=True)

    def snapshot(self) -> Any:
        """The registrations as they are now, for :meth:`restore`."""
        return dict(self.methods), dict(self.qualified), dict(self._objects), set(self._replaced)

    def restore(self, snapshot: Any) -> None:
        """Undo every registration made since ``snapshot``."""
        methods, qualified, objects, replaced = snapshot
        for key in set(self.qualified) - set(qualified):
            self._forget(key)
        self.methods, self.qualified, self._objects = dict(methods), dict(qualified), dict(objects)
        self._replaced = set(replaced)

    # -- lookups -------------------------------------------------------------------

    def info(self, name: str) -> MethodInfo:
        """The registration behind ``name`` or ``plugin:name``."""
        found = self.qualified.get(name) if ":" in name else self.methods.get(name)
        if found is None:
            raise UnknownMethodError(self._unknown_message(name))
        return found

    def resolve(self, name: str) -> type:
        """The method class for ``name``, importing its module the first time.

        A target that cannot be imported, or is no :class:`BasePruningMethod` of
        the registered kind, sets its method aside: the plugin's status becomes
        ``error`` and a :class:`PluginWarning` is issued (once), then
        :class:`UnknownMethodError` is raised; in strict mode :class:`PluginError`.
        Every other method keeps working.
        """
        info = self.info(name)
        key = info.qualified_name
        if key in self._classes:
            return self._classes[key]
        if key in self._failures:
            raise self._unavailable(self._failures[key])
        try:
            return self._import(key, info)
        except Exception as error:
            failure = self._set_aside(info, error)
            warnings.warn(failure, PluginWarning, stacklevel=3)
            raise self._unavailable(failure) from error

    def check_targets(self) -> list[str]:
        """Import every registered target now, recording each failure; returns the new failures."""
        failures = []
        for key, info in list(self.qualified.items()):
            if key in self._classes or key in self._failures:
                continue
            try:
                self._import(key, info)
            except Exception as error:
                failures.append(self._set_aside(info, error))
        return failures

    def names(self, kind: str | None = None) -> list[str]:
        """Plain method names, sorted, optionally of one kind only."""
        return sorted(name for name, info in self.methods.items() if kind is None or info.kind == kind)

    # -- internals -----------------------------------------------------------------

    def _import(self, key: str, info: MethodInfo) -> type:
        cls = self._objects[key] if key in self._objects else import_target(info.target)
        _check_method_class(cls, info)
        self._classes[key] = cls
        return cls

    def _set_aside(self, info: MethodInfo, error: BaseException) -> str:
        problem = f"method {info.name!r} is unavailable: cannot use {info.target!r}: {describe(error)}"
        plugin = self.plugins.get(info.plugin)
        message = plugin.record("error", problem) if plugin else f"prunereg {problem}"
        self._failures[info.qualified_name] = message
        return message

    def _unavailable(self, failure: str) -> Exception:
        return PluginError(failure) if self.strict else UnknownMethodError(failure)

    def _forget(self, key: str) -> None:
        self._classes.pop(key, None)
        self._failures.pop(key, None)

    def _unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self.methods) + list(self.qualified), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        return f"no pruning method named {name!r}{hint} (known: {', '.join(self.names()) or 'none'})"


def _origin(info: MethodInfo) -> str:
    origin = f"{info.package} {info.version}" if info.package else "no installed distribution"
    return f"plugin {info.plugin!r} ({origin})"


def describe(error: BaseException) -> str:
    """``Type: message`` for an exception, as the reports show it."""
    return f"{type(error).__name__}: {error}"


def import_target(target: str) -> Any:
    """Import ``"package.module:Attr"`` (``Attr`` may be dotted)."""
    module_name, _, attribute = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, attribute.split(".")):
        obj = getattr(obj, part)
    return obj


def target_name(target: object) -> str:
    """The ``"module:Attr"`` string for a class or a target string."""
    if isinstance(target, str):
        module, colon, attribute = target.partition(":")
        if not (module and colon and attribute):
            raise ValueError(f"target {target!r} must look like 'package.module:ClassName'")
        return target
    if not isinstance(target, type):
        raise TypeError(f"target must be a class or a 'module:ClassName' string, not {target!r}")
    return f"{target.__module__}:{target.__qualname__}"


def validate_registration(name: object, kind: object, summary: object) -> None:
    """Reject a method name, kind or summary that listings and lookups could not handle."""
    if not isinstance(name, str) or not name or any(c in name for c in ": \t\n"):
        raise ValueError(f"method name must be a non-empty string without ':' or whitespace, not {name!r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if not isinstance(summary, str) or "\n" in summary.strip():
        raise ValueError(f"summary must be a one-line string, not {summary!r}")


def _check_method_class(cls: object, info: MethodInfo) -> None:
    # Without importing the contracts (the registry sits below them): a class can
    # subclass BasePruningMethod, or CalibratedMethod, only once its module is loaded.
    contract, base_name = "prunereg._method", "BasePruningMethod"
    if info.kind == "calibrated":
        contract, base_name = "prunereg._calibrated", "CalibratedMethod"
    base = getattr(sys.modules.get(contract), base_name, None)
    if base is None or not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{info.target!r} is not a {base_name} subclass")
    if getattr(cls, "PRUNING_TYPE", None) != info.kind:
        raise TypeError(
            f"registered as kind {info.kind!r} but the class has PRUNING_TYPE "
            f"{getattr(cls, 'PRUNING_TYPE', None)!r}"
        )


def constructor_parameters(cls: type, *, evaluated: bool = False) -> dict[str, inspect.Parameter] | None:
    """The parameters ``cls(...)`` takes, or None when its signature cannot be read.

    ``evaluated`` resolves string annotations (``from __future__ import
    annotations``) where they can be evaluated, and keeps the text where not.
    """
    for evaluate in (True, False) if evaluated else (False,):
        try:
            return dict(inspect.signature(cls, eval_str=evaluate).parameters)
        except (NameError, SyntaxError, TypeError, ValueError):  # annotations a plugin cannot evaluate
            continue
    return None
