"""Plugins without packages: fake entry points, fake plugin modules and tiny method classes.

Targets of the fake plugins name the classes here as ``"tests.support.plugin_fakes:KeepAll"``.
"""

from __future__ import annotations

import importlib
import os
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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
    """What the loader uses of an ``importlib.metadata.EntryPoint``: name, dist, load().

    ``on_import`` runs inside ``load()``, as a real plugin's module-level code would.
    """

    def __init__(
        self,
        name: str,
        dist: FakeDistribution | None,
        loaded: Any,
        error: BaseException | None,
        on_import: Callable[[], object] | None = None,
    ) -> None:
        self.name, self.dist, self._loaded, self._error, self._on_import = name, dist, loaded, error, on_import

    def load(self) -> Any:
        if self._on_import is not None:
            self._on_import()
        if self._error is not None:
            raise self._error
        return self._loaded

    def __repr__(self) -> str:
        return f"FakeEntryPoint({self.name!r}, {self.dist})"


def method(
    name: str,
    target: object = "tests.support.plugin_fakes:KeepAll",
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
    raises: BaseException | None = None,
    import_error: BaseException | None = None,
    module: Any = None,
    on_import: Callable[[], object] | None = None,
    in_hook: Callable[[], object] | None = None,
) -> FakeEntryPoint:
    """An entry point ``name`` of distribution ``package`` (default ``prunereg-<name>``).

    Loading it runs ``on_import`` then raises ``import_error``, if given. Its
    hook runs ``in_hook``, registers ``methods`` in order, then raises
    ``raises``, if given. ``module`` replaces the fake module and its hook.
    """
    if module is None:
        module = types.ModuleType(f"prunereg_fake_{name}")

        @prunereg.hookimpl
        def prunereg_register_methods(register: Any) -> None:
            if in_hook is not None:
                in_hook()
            for registration in methods:
                arguments = dict(registration)
                register(arguments.pop("name"), arguments.pop("target"), **arguments)
            if raises is not None:
                raise raises

        module.prunereg_register_methods = prunereg_register_methods
    dist = FakeDistribution(package or f"prunereg-{name}", version)
    return FakeEntryPoint(name, dist, module, import_error, on_import)


def builtins() -> FakeEntryPoint:
    """prunereg's real built-in plugin, as its own distribution's entry point."""
    return plugin(
        "builtins",
        package="prunereg",
        version=prunereg.__version__,
        module=importlib.import_module("prunereg_builtins"),
    )


def fake_install(site: Path, module: str, source: str, version: str = "1.0") -> None:
    """Install a one-module plugin by hand: a real dist-info with an entry point, no pip needed."""
    distribution = module.replace("_", "-")
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[prunereg]\n{module.removeprefix('prunereg_')} = {module}\n")


def site_env(site: Path) -> dict[str, str]:
    """The environment variables that put ``site`` first on a subprocess's ``sys.path``."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
