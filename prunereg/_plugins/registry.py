"""The method registry: names to method classes, filled by plugins, resolved lazily.

Nothing here imports torch or a plugin's implementation: a registration is a
name, a kind, a summary and a ``"module:Attr"`` target, imported on the first
:meth:`Registry.resolve`. The registry owns all of its state: plugins are
added, loaded and registered through its methods, and every problem is
recorded on the plugin that caused it (:class:`PluginInfo`) by the registry
itself. How problems are reported (warning or error) is up to the caller, see
:mod:`prunereg._plugins.loading`.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from prunereg._plugins.isolation import PLUGIN_FAILURES, UserInterrupt, plugin_code
from prunereg._plugins.kinds import kind as kind_named
from prunereg._text import describe, printable

Register = Callable[..., None]
"""``register(name, target, *, kind, summary, replace=False)``: see :class:`prunereg._plugins.hookspec.Register`."""

LOCAL_PLUGIN = "local"
"""The plugin name of methods registered in-process with :func:`prunereg.register`."""

MAX_NAME_LENGTH = 100
_METHOD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*", re.ASCII)
NAME_RULE = f"an ASCII letter, then ASCII letters, digits, '_' or '-', at most {MAX_NAME_LENGTH} characters in all"
"""The documented character set of method names (docs/plugins.md)."""


class UnknownMethodError(LookupError):
    """No usable pruning method is registered under the name asked for."""


class PluginWarning(UserWarning):
    """A plugin could not be loaded, or one of its methods was set aside."""


class PluginError(RuntimeError):
    """A plugin could not be loaded, in strict mode (``PRUNEREG_STRICT_PLUGINS=1``)."""


def origin(plugin: str, package: str | None, version: str | None) -> str:
    """How every message names a plugin: ``plugin 'nm' (prunereg-nm 1.2)``."""
    if package:
        where = printable(f"{package} {version}")
    elif plugin == LOCAL_PLUGIN:
        where = "registered in this process"
    else:
        where = "no installed distribution"
    return f"plugin {plugin!r} ({where})"


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

    @property
    def label(self) -> str:
        """The plugin this method came from, as messages name it."""
        return origin(self.plugin, self.package, self.version)

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
        return origin(self.name, self.package, self.version)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Saved:
    """The registry's state before a plugin ran, to undo everything the plugin did if it fails."""

    methods: dict[str, MethodInfo]
    qualified: dict[str, MethodInfo]
    objects: dict[str, object]
    replaced: set[str]
    problems: int


class Registry:
    """Methods by name, and the plugins they came from.

    Two registrations of one name are never resolved silently: the first one
    wins, and the later one is reported as a conflict on its plugin. A
    registration with ``replace=True`` takes the name over on purpose, once: a
    second ``replace=True`` for the same name is a conflict again. Every kind
    shares one name space, and ``replace=True`` never takes a name from another
    kind (a ``magnitude`` importance would evict the calibrated ``magnitude``).
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

    # -- plugins -------------------------------------------------------------------

    def add_plugin(self, name: str, package: str | None, version: str | None, *, status: str = "loaded") -> bool:
        """Record a plugin with its load ``status``; False when its name is taken (a conflict, reported)."""
        plugin = PluginInfo(name, package, version, status)
        holder = self.plugins.get(name)
        if holder is None and name != LOCAL_PLUGIN:
            self.plugins[name] = plugin
            return True
        why = f"the name is taken by {holder.label}" if holder else "the name is reserved for in-process registrations"
        self.plugins[f"{name} ({package})"] = plugin
        self.report(f"was skipped: {why}; rename its entry point", plugin=plugin, status="conflict")
        return False

    def load_plugin(self, name: str, load: Callable[[Register], object]) -> None:
        """Run ``load(register)``, which imports plugin ``name`` and calls its hook, as one transaction.

        If ``load`` fails in any way (an exception, ``sys.exit()``, a
        ``KeyboardInterrupt`` raised by the plugin), every registration it made
        is withdrawn and the plugin is recorded as failed; the user's Ctrl-C
        still propagates. Conflicts are recorded as they happen.
        """
        plugin = self.plugins[name]
        saved = self._save()
        try:
            with plugin_code():
                load(self._registrar(name))
        except UserInterrupt:
            raise
        except PLUGIN_FAILURES as error:
            self._restore(saved)
            plugin.status, plugin.methods, plugin.error = "loaded", [], None
            self.report(f"failed to load and was skipped: {describe(error)}", plugin=plugin)

    def report(self, problem: str, *, plugin: PluginInfo | None = None, status: str = "error") -> str:
        """Record a load problem (on ``plugin`` with ``status``, if given); returns the message."""
        message = self._record(plugin, status, problem) if plugin else f"prunereg: {problem}"
        self.problems.append(message)
        return message

    # -- registrations -------------------------------------------------------------

    def register(
        self, plugin: str, name: str, target: object, *, kind: str, summary: str, replace: bool = False
    ) -> None:
        """One registration from installed ``plugin``; a clash is recorded as a conflict on the plugin."""
        info = self._method_info(plugin, name, target, kind, summary)
        clash = self._add(info, target, replace=replace)
        if clash is not None:
            self.report(clash, plugin=self.plugins[plugin], status="conflict")

    def register_local(self, cls: type, name: str, *, kind: str, summary: str, replace: bool) -> None:
        """Register ``cls`` in-process, as plugin ``local``: see :func:`prunereg.register`.

        Registering a name again from ``local`` redefines it (a notebook cell run
        twice); taking a name from another plugin needs ``replace=True``, else
        ``ValueError``. A class registered in-process is checked at once.
        """
        info = self._method_info(LOCAL_PLUGIN, name, cls, kind, summary)
        _check_method_class(cls, info)
        holder = self.methods.get(name)
        if holder is not None and holder.plugin != LOCAL_PLUGIN and holder.kind != kind:
            raise ValueError(other_kind(holder, kind))
        if holder is not None and holder.plugin != LOCAL_PLUGIN and not replace:
            raise ValueError(
                f"a pruning method named {name!r} is already registered by {holder.label}; "
                "pass replace=True to take the name over, or choose another name"
            )
        self.plugins.setdefault(LOCAL_PLUGIN, PluginInfo(LOCAL_PLUGIN, None, None))
        self._replaced.discard(name)
        self._add(info, cls, replace=True)

    # -- lookups -------------------------------------------------------------------

    def info(self, name: str) -> MethodInfo:
        """The registration behind ``name`` or ``plugin:name``."""
        found = self.qualified.get(name) if ":" in name else self.methods.get(name)
        if found is None:
            raise UnknownMethodError(self.unknown_message(name))
        return found

    def resolve(self, name: str) -> type:
        """The method class for ``name``, importing its module the first time.

        A target that cannot be imported (whatever its module does, exiting
        included), or is no :class:`BasePruningMethod` of the registered kind,
        sets its method aside: the plugin's status becomes ``error`` and a
        :class:`PluginWarning` is issued (once), then :class:`UnknownMethodError`
        is raised; in strict mode :class:`PluginError`. Every other method keeps working.
        """
        info = self.info(name)
        key = info.qualified_name
        if key in self._classes:
            return self._classes[key]
        if key in self._failures:
            raise self._unavailable(self._failures[key])
        try:
            return self._import(key, info)
        except UserInterrupt:
            raise
        except PLUGIN_FAILURES as error:
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
            except UserInterrupt:
                raise
            except PLUGIN_FAILURES as error:
                failures.append(self._set_aside(info, error))
        return failures

    def names(self, kind: str | None = None) -> list[str]:
        """Plain method names, sorted, optionally of one kind only."""
        return sorted(name for name, info in self.methods.items() if kind is None or info.kind == kind)

    # -- internals -----------------------------------------------------------------

    def _registrar(self, plugin: str) -> Register:
        def register(name: str, target: object, *, kind: str, summary: str, replace: bool = False) -> None:
            self.register(plugin, name, target, kind=kind, summary=summary, replace=replace)

        return register

    def _method_info(self, plugin: str, name: str, target: object, kind: str, summary: str) -> MethodInfo:
        validate_registration(name, kind, summary)
        owner = self.plugins.get(plugin)
        package, version = (owner.package, owner.version) if owner else (None, None)
        return MethodInfo(name, kind, summary.strip(), plugin, package, version, target_name(target))

    def _add(self, info: MethodInfo, target: object, *, replace: bool) -> str | None:
        """The one place a registration enters the registry.

        Returns a description of the clash when the name stays with an earlier
        registration, and None when ``info`` now holds it.
        """
        key = info.qualified_name
        if key in self.qualified and not replace:
            return f"registers {info.name!r} twice; the first registration is kept"
        self.qualified[key] = info
        self._forget(key)
        if not isinstance(target, str):
            self._objects[key] = target
        plugin = self.plugins.get(info.plugin)
        if plugin is not None and info.name not in plugin.methods:
            plugin.methods.append(info.name)
        holder = self.methods.get(info.name)
        if holder is not None and holder.plugin != info.plugin and (not replace or info.name in self._replaced):
            how = "took it over with replace=True" if info.name in self._replaced else "registered it first"
            return (
                f"method {info.name!r} conflicts with {holder.label}, which {how}: "
                f"{info.name!r} stays {holder.plugin!r}'s; reach this one as {key!r}"
                + ("" if replace else ", or register it with replace=True to take the name over")
            )
        if holder is not None and holder.plugin != info.plugin and holder.kind != info.kind:
            return f"{other_kind(holder, info.kind)}; reach this one as {key!r}"
        if holder is not None and replace and holder.plugin != info.plugin:
            self._replaced.add(info.name)
        self.methods[info.name] = info
        return None

    def _save(self) -> _Saved:
        return _Saved(
            dict(self.methods), dict(self.qualified), dict(self._objects), set(self._replaced), len(self.problems)
        )

    def _restore(self, saved: _Saved) -> None:
        for key in set(self.qualified) - set(saved.qualified):
            self._forget(key)
        self.methods, self.qualified, self._objects = dict(saved.methods), dict(saved.qualified), dict(saved.objects)
        self._replaced = set(saved.replaced)
        del self.problems[saved.problems :]

    def _record(self, plugin: PluginInfo, status: str, problem: str) -> str:
        """Note a problem on ``plugin``; ``error`` outranks ``conflict``. Returns the message to report."""
        if plugin.status != "error":
            plugin.status = status
        plugin.error = problem if plugin.error is None else f"{plugin.error}; {problem}"
        return f"prunereg {plugin.label}: {problem}"

    def _import(self, key: str, info: MethodInfo) -> type:
        if key in self._objects:
            found = self._objects[key]
        else:
            with plugin_code():
                found = import_target(info.target)
        _check_method_class(found, info)
        cls = self._classes[key] = cast(type, found)  # a class: checked just above
        return cls

    def _set_aside(self, info: MethodInfo, error: BaseException) -> str:
        problem = f"method {info.name!r} is unavailable: cannot use {info.target!r}: {describe(error)}"
        plugin = self.plugins.get(info.plugin)
        message = self._record(plugin, "error", problem) if plugin else f"prunereg {problem}"
        self._failures[info.qualified_name] = message
        return message

    def _unavailable(self, failure: str) -> Exception:
        return PluginError(failure) if self.strict else UnknownMethodError(failure)

    def _forget(self, key: str) -> None:
        self._classes.pop(key, None)
        self._failures.pop(key, None)

    def unknown_message(self, name: str, known: list[str] | None = None) -> str:
        """ "no pruning method named ...", with close matches and the ``known`` names (default: every method)."""
        close = difflib.get_close_matches(name, list(self.methods) + list(self.qualified), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        known = self.names() if known is None else known
        return f"no pruning method named {name!r}{hint} (known: {', '.join(known) or 'none'})"


def other_kind(holder: MethodInfo, kind: str) -> str:
    """Why a name held by a method of another kind is refused: one name space for every kind, never an eviction."""
    return (
        f"{holder.name!r} is the {holder.kind} method of {holder.label}, and one name serves every kind: "
        f"kind {kind!r} cannot take it, replace=True or not; choose another name"
    )


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
    if not (isinstance(name, str) and len(name) <= MAX_NAME_LENGTH and _METHOD_NAME.fullmatch(name)):
        raise ValueError(f"method name must be {NAME_RULE}, not {name!r}")
    kind_named(kind)  # ValueError naming the declared kinds
    if not isinstance(summary, str) or len(summary.strip().splitlines()) > 1:
        raise ValueError(f"summary must be a one-line string, not {summary!r}")


def _check_method_class(cls: object, info: MethodInfo) -> None:
    # Without importing the contract (the registry sits below it): a class can
    # subclass its kind's contract only once the contract's module is loaded.
    kind = kind_named(info.kind)
    base = getattr(sys.modules.get(kind.contract_module), kind.contract_class, None)
    if base is None or not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{info.target!r} is not a {kind.contract_class} subclass")
    if getattr(cls, "PRUNING_TYPE", None) != info.kind:
        raise TypeError(
            f"registered as kind {info.kind!r} but the class has PRUNING_TYPE {getattr(cls, 'PRUNING_TYPE', None)!r}"
        )


def constructor_parameters(cls: type, *, evaluated: bool = False) -> dict[str, inspect.Parameter] | None:
    """The parameters ``cls(...)`` takes, or None when its signature cannot be read for any reason.

    ``evaluated`` resolves string annotations (``from __future__ import
    annotations``) where they can be evaluated; where they cannot (a name that
    does not exist, ``torch.NoSuchType``, anything raising), the raw signature
    with the annotations as text is used instead.
    """
    for evaluate in (True, False) if evaluated else (False,):
        try:
            return dict(inspect.signature(cls, eval_str=evaluate).parameters)
        except Exception:  # a plugin's signature or annotations can fail in any way; fall back, then give up
            continue
    return None


def untaken_argument(cls: type, keys: Iterable[str], *, leave_out: Iterable[str] = ()) -> str | None:
    """``does not take argument 'x' (it takes: a, b)`` for the first of ``keys`` that ``cls(...)`` does not take.

    None when it takes them all, takes ``**kwargs``, or its signature cannot be
    read (the constructor itself then judges). ``leave_out``: parameters not to
    list as taken (those the caller sets itself).
    """
    parameters = constructor_parameters(cls)
    if parameters is None or any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return None
    named = [name for name, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [key for key in keys if key not in named]
    if not unknown:
        return None
    skipped = set(leave_out)
    takes = ", ".join(name for name in named if name not in skipped) or "no arguments"
    return f"does not take argument {unknown[0]!r} (it takes: {takes})"
