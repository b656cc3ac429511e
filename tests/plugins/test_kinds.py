"""Kinds of methods: each declared once, naming its contract, and the registry checks classes against it."""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import ClassVar

import pytest

import prunereg
import prunereg_builtins
import prunereg_llm
from prunereg._plugins import hookspec, kinds
from prunereg._plugins.registry import PluginWarning, Registry, UnknownMethodError, import_target
from tests.support.plugin_fakes import KeepAll


class ShrinkContract:
    """A contract for a kind declared in a test, as a new subsystem of prunereg would declare one."""

    PRUNING_TYPE: ClassVar[str]


class Shrink(ShrinkContract):
    PRUNING_TYPE = "merge"


@pytest.fixture
def declared_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The declared kinds, with whatever the test declares forgotten after it."""
    monkeypatch.setattr(kinds, "_KINDS", dict(kinds._KINDS))


def registry_with(name: str, target: object, kind: str) -> Registry:
    registry = Registry()
    registry.add_plugin("a", "prunereg-a", "1.0")
    registry.register("a", name, target, kind=kind, summary="A fake")
    return registry


def test_the_kinds_are_the_torch_mask_kinds_and_then_prunereg_s_own() -> None:
    assert kinds.kind_names()[:4] == ("unstructured", "structured", "global", "calibrated")
    assert kinds.kind_names(masks=True) == ("unstructured", "structured", "global")
    assert "calibrated" in kinds.kind_names(masks=False)


@pytest.mark.parametrize("kind", kinds.kinds(), ids=lambda kind: kind.name)
def test_every_kind_names_a_contract_that_plugins_can_subclass(kind: kinds.Kind) -> None:
    contract = import_target(kind.contract)
    assert inspect.isclass(contract)
    assert getattr(prunereg, kind.contract_class) is contract  # public: plugins import only prunereg


@pytest.mark.parametrize("name", prunereg.list_methods())
def test_every_registered_method_subclasses_its_kinds_contract(name: str) -> None:
    kind = kinds.kind(prunereg.info(name).kind)
    cls = prunereg.get(name)
    assert issubclass(cls, import_target(kind.contract)) and kind.name == cls.PRUNING_TYPE


def test_a_new_kind_is_one_declaration(declared_here: None) -> None:
    kinds.declare_kind("merge", f"{__name__}:ShrinkContract", "`prunereg.merge`")
    assert kinds.kind_names()[-1] == "merge" and not kinds.kind("merge").masks
    registry = registry_with("halve", f"{__name__}:Shrink", "merge")
    assert registry.resolve("halve") is Shrink
    assert registry.names("merge") == ["halve"]


def test_a_class_of_another_contract_is_set_aside_naming_the_kinds_contract(declared_here: None) -> None:
    kinds.declare_kind("merge", f"{__name__}:ShrinkContract", "`prunereg.merge`")
    registry = registry_with("halve", KeepAll, "merge")
    with pytest.warns(PluginWarning, match="is not a ShrinkContract subclass"), pytest.raises(UnknownMethodError):
        registry.resolve("halve")


def test_an_undeclared_kind_is_refused_naming_the_declared_ones() -> None:
    declared = ", ".join(kinds.kind_names())
    assert declared.startswith("unstructured, structured, global, calibrated")
    with pytest.raises(ValueError, match=f"kind must be one of {declared}, not 'merge'"):
        registry_with("halve", f"{__name__}:Shrink", "merge")


@pytest.mark.parametrize(
    ("name", "contract", "message"),
    [
        ("calibrated", f"{__name__}:ShrinkContract", "already declared"),
        ("Shrink", f"{__name__}:ShrinkContract", "lowercase identifier"),
        ("merge", "ShrinkContract", "must look like 'package.module:Class'"),
        ("merge", f"{__name__}:", "must look like 'package.module:Class'"),
    ],
)
def test_a_bad_declaration_is_refused(declared_here: None, name: str, contract: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kinds.declare_kind(name, contract, "")


def test_kinds_are_known_without_importing_torch() -> None:
    code = "import sys; from prunereg._plugins import kinds; kinds.kind_names(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_the_hook_reference_names_every_kind() -> None:
    reference = hookspec.prunereg_register_methods.__doc__ or ""
    missing = [name for name in kinds.kind_names() if f'``"{name}"``' not in reference]
    assert missing == [], f"the hookspec's docstring does not name the kinds {missing}"


@pytest.mark.parametrize("plugin", [prunereg_builtins, prunereg_llm], ids=lambda module: module.__name__)
def test_the_built_in_plugins_hooks_are_typed(plugin: object) -> None:
    signature = inspect.signature(plugin.prunereg_register_methods)  # type: ignore[attr-defined]
    assert signature.parameters["register"].annotation is prunereg.Register
    assert signature.return_annotation is None
