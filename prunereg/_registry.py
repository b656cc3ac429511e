"""The method registry: names to method classes, filled by plugins, resolved lazily."""

from __future__ import annotations

import difflib
import importlib
from dataclasses import asdict, dataclass, field
from typing import Any


class UnknownMethodError(LookupError):
    """No pruning method is registered under the name asked for."""


class PluginWarning(UserWarning):
    """A plugin could not be loaded, or one of its methods was set aside."""


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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PluginInfo:
    """One plugin and how loading it went: ``status`` is loaded, error, conflict or blocked."""

    name: str
    package: str | None
    version: str | None
    status: str = "loaded"
    methods: list[str] = field(default_factory=list)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Registry:
    """Methods by name, and the plugins they came from.

    Two registrations of one name are never resolved silently: the first one
    wins unless the second passes ``replace=True``, and the loser is reported.
    ``plugin:method`` always names one plugin's own registration.
    """

    def __init__(self) -> None:
        self.methods: dict[str, MethodInfo] = {}
        self.qualified: dict[str, MethodInfo] = {}
        self.plugins: dict[str, PluginInfo] = {}
        self._objects: dict[str, object] = {}
        self._classes: dict[str, type] = {}

    def add(self, info: MethodInfo, target: object = None, *, replace: bool = False) -> str | None:
        """Register ``info``; return a description of the clash if the name was taken."""
        self.qualified[f"{info.plugin}:{info.name}"] = info
        if target is not None and not isinstance(target, str):
            self._objects[info.target] = target
        existing = self.methods.get(info.name)
        if existing is not None and not replace:
            return (
                f"method {info.name!r} of plugin {info.plugin!r} ({info.package}) is ignored: "
                f"plugin {existing.plugin!r} ({existing.package}) registered it first; "
                f"use '{info.plugin}:{info.name}' to reach it, or register with replace=True"
            )
        self.methods[info.name] = info
        return None

    def info(self, name: str) -> MethodInfo:
        """The registration behind ``name`` or ``plugin:name``."""
        found = self.qualified.get(name) if ":" in name else self.methods.get(name)
        if found is None:
            raise UnknownMethodError(self._unknown_message(name))
        return found

    def resolve(self, name: str) -> type:
        """The method class for ``name``, importing its module the first time."""
        info = self.info(name)
        cls = self._classes.get(info.target)
        if cls is None:
            cls = self._objects.get(info.target) or import_target(info.target)
            _check_method_class(cls, info)
            self._classes[info.target] = cls
        return cls

    def names(self) -> list[str]:
        return sorted(self.methods)

    def _unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self.methods) + list(self.qualified), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        return f"no pruning method named {name!r}{hint} (known: {', '.join(self.names()) or 'none'})"


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
        if ":" not in target:
            raise ValueError(f"target {target!r} must look like 'package.module:ClassName'")
        return target
    return f"{target.__module__}:{target.__qualname__}"


def _check_method_class(cls: object, info: MethodInfo) -> None:
    from prunereg._method import BasePruningMethod

    if not (isinstance(cls, type) and issubclass(cls, BasePruningMethod)):
        raise TypeError(
            f"method {info.name!r} of plugin {info.plugin!r} names {info.target!r}, "
            "which is not a BasePruningMethod subclass"
        )
    if getattr(cls, "PRUNING_TYPE", None) != info.kind:
        raise TypeError(
            f"method {info.name!r} of plugin {info.plugin!r} was registered as kind "
            f"{info.kind!r} but its class has PRUNING_TYPE {getattr(cls, 'PRUNING_TYPE', None)!r}"
        )
