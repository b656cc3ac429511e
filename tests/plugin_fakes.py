"""Plugins without packages: fake entry points, fake plugin modules and tiny method classes.

Targets of the fake plugins name the classes here as ``"plugin_fakes:KeepAll"``.
"""

from __future__ import annotations

import importlib
import types
from dataclasses import dataclass
from typing import Any

import torch

import prunereg
from prunereg import BasePruningMethod

MISSING_TARGET = "prunereg_fake_missing.method:Gone"


class KeepAll(BasePruningMethod):
    """Prune nothing (a fake unstructured method)."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        return default_mask.clone()


class DropFirstChannel(BasePruningMethod):
    """Prune channel 0 along dim 0 (a fake structured method)."""

    PRUNING_TYPE = "structured"
    dim = 0

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        mask = default_mask.clone()
        mask[0] = 0
        return mask


@dataclass(frozen=True)
class FakeDistribution:
    name: str
    version: str


class FakeEntryPoint:
    """What the loader uses of an ``importlib.metadata.EntryPoint``: name, dist, load()."""

    def __init__(self, name: str, dist: FakeDistribution | None, loaded: Any, error: Exception | None) -> None:
        self.name, self.dist, self._loaded, self._error = name, dist, loaded, error

    def load(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._loaded

    def __repr__(self) -> str:
        return f"FakeEntryPoint({self.name!r}, {self.dist})"


def method(
    name: str,
    target: object = "plugin_fakes:KeepAll",
    *,
    kind: str = "unstructured",
    summary: str | None = None,
    replace: bool = False,
) -> dict[str, Any]:
    """The arguments of one ``register`` call."""
    return {"name": name, "target": target, "kind": kind, "summary": summary or f"The fake {name}", "replace": replace}


def plugin(
    name: str,
    *methods: dict[str, Any],
    package: str | None = None,
    version: str = "1.0",
    raises: Exception | None = None,
    import_error: Exception | None = None,
    module: Any = None,
) -> FakeEntryPoint:
    """An entry point ``name`` of distribution ``package`` (default ``prunereg-<name>``).

    Its hook registers ``methods`` in order, then raises ``raises`` if given;
    loading it raises ``import_error`` if given; ``module`` replaces the fake module.
    """
    if module is None:
        module = types.ModuleType(f"prunereg_fake_{name}")

        @prunereg.hookimpl
        def prunereg_register_methods(register: Any) -> None:
            for registration in methods:
                arguments = dict(registration)
                register(arguments.pop("name"), arguments.pop("target"), **arguments)
            if raises is not None:
                raise raises

        module.prunereg_register_methods = prunereg_register_methods
    dist = FakeDistribution(package or f"prunereg-{name}", version)
    return FakeEntryPoint(name, dist, module, import_error)


def builtins() -> FakeEntryPoint:
    """prunereg's real built-in plugin, as its own distribution's entry point."""
    return plugin("builtins", package="prunereg", version=prunereg.__version__, module=importlib.import_module("prunereg_builtins"))
