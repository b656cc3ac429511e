"""The Registry on its own: names, conflicts, qualified lookups, lazy resolution, in-process registration."""

from __future__ import annotations

import pytest
from plugin_fakes import MISSING_TARGET, DropFirstChannel, KeepAll

from prunereg._registry import (
    MethodInfo,
    PluginError,
    PluginInfo,
    PluginWarning,
    Registry,
    UnknownMethodError,
    import_target,
    target_name,
    validate_registration,
)


def info(name: str, plugin: str = "a", target: str = "plugin_fakes:KeepAll", kind: str = "unstructured") -> MethodInfo:
    return MethodInfo(name, kind, f"The fake {name}", plugin, f"prunereg-{plugin}", "1.0", target)


def registry_with_plugins(*names: str, strict: bool = False) -> Registry:
    registry = Registry(strict=strict)
    for name in names:
        registry.plugins[name] = PluginInfo(name, f"prunereg-{name}", "1.0")
    return registry


def test_a_registered_method_is_found_by_name_and_qualified_name() -> None:
    registry = Registry()
    assert registry.add(info("keep")) is None
    assert registry.info("keep") == registry.info("a:keep") == info("keep")
    assert registry.resolve("keep") is KeepAll
    assert registry.names() == ["keep"]


def test_the_first_registration_keeps_the_name_and_the_clash_names_both_packages() -> None:
    registry = Registry()
    registry.add(info("keep", plugin="a"))
    clash = registry.add(info("keep", plugin="b", target="plugin_fakes:DropFirstChannel", kind="structured"))
    assert clash is not None
    assert "plugin 'a' (prunereg-a 1.0)" in clash and "'b:keep'" in clash and "replace=True" in clash
    assert registry.info("keep").plugin == "a"
    assert registry.resolve("b:keep") is DropFirstChannel


def test_replace_takes_a_name_over_once_and_a_second_replace_is_a_clash() -> None:
    registry = Registry()
    registry.add(info("keep", plugin="a"))
    assert registry.add(info("keep", plugin="b"), replace=True) is None
    assert registry.info("keep").plugin == "b"
    clash = registry.add(info("keep", plugin="c"), replace=True)
    assert clash is not None and "took it over with replace=True" in clash
    assert registry.info("keep").plugin == "b"
    assert registry.info("a:keep").plugin == "a"


def test_one_plugin_registering_a_name_twice_keeps_the_first() -> None:
    registry = Registry()
    registry.add(info("keep"))
    clash = registry.add(info("keep", target="plugin_fakes:DropFirstChannel", kind="structured"))
    assert clash is not None and "twice" in clash
    assert registry.resolve("keep") is KeepAll


def test_restore_withdraws_everything_registered_after_the_snapshot() -> None:
    registry = Registry()
    registry.add(info("keep", plugin="a"))
    snapshot = registry.snapshot()
    registry.add(info("keep", plugin="b"), replace=True)
    registry.add(info("other", plugin="b"))
    registry.restore(snapshot)
    assert registry.names() == ["keep"]
    assert registry.info("keep").plugin == "a"
    with pytest.raises(UnknownMethodError):
        registry.info("b:other")
    # The name was never taken over for good: a later plugin may still replace it.
    assert registry.add(info("keep", plugin="c"), replace=True) is None


def test_an_unknown_name_suggests_close_ones() -> None:
    registry = Registry()
    registry.add(info("keep_all"))
    with pytest.raises(UnknownMethodError, match=r"'kep_all'.*did you mean 'keep_all'"):
        registry.info("kep_all")
    with pytest.raises(LookupError, match="no pruning method named 'x:keep_all'"):
        registry.resolve("x:keep_all")


def test_an_unimportable_target_is_set_aside_with_a_warning_naming_package_and_version() -> None:
    registry = registry_with_plugins("a")
    registry.add(info("gone", target=MISSING_TARGET))
    registry.add(info("keep"))
    with pytest.warns(PluginWarning, match=r"plugin 'a' \(prunereg-a 1.0\).*'gone'.*ModuleNotFoundError"):
        with pytest.raises(UnknownMethodError, match="unavailable") as raised:
            registry.resolve("gone")
    assert isinstance(raised.value.__cause__, ModuleNotFoundError)
    assert registry.plugins["a"].status == "error"
    assert "prunereg_fake_missing" in (registry.plugins["a"].error or "")
    # Reported once, raised every time; every other method keeps working.
    with pytest.raises(UnknownMethodError, match="unavailable"):
        registry.resolve("gone")
    assert registry.resolve("keep") is KeepAll


def test_in_strict_mode_an_unimportable_target_raises_plugin_error() -> None:
    registry = registry_with_plugins("a", strict=True)
    registry.add(info("gone", target=MISSING_TARGET))
    with pytest.warns(PluginWarning), pytest.raises(PluginError, match="ModuleNotFoundError"):
        registry.resolve("gone")


@pytest.mark.parametrize(
    ("target", "kind", "message"),
    [
        ("plugin_fakes:DropFirstChannel", "unstructured", "PRUNING_TYPE 'structured'"),
        ("plugin_fakes:method", "unstructured", "not a BasePruningMethod subclass"),
        ("plugin_fakes:NoSuchClass", "unstructured", "AttributeError"),
    ],
)
def test_a_target_of_the_wrong_kind_or_type_is_set_aside(target: str, kind: str, message: str) -> None:
    registry = registry_with_plugins("a")
    registry.add(info("bad", target=target, kind=kind))
    with pytest.warns(PluginWarning, match=message), pytest.raises(UnknownMethodError):
        registry.resolve("bad")


def test_check_targets_records_every_failure_without_raising() -> None:
    registry = registry_with_plugins("a", "b")
    registry.add(info("keep", plugin="a"))
    registry.add(info("gone", plugin="b", target=MISSING_TARGET))
    failures = registry.check_targets()
    assert len(failures) == 1 and "prunereg-b 1.0" in failures[0]
    assert (registry.plugins["a"].status, registry.plugins["b"].status) == ("loaded", "error")
    assert registry.check_targets() == []


def test_a_class_target_is_used_as_is() -> None:
    registry = Registry()

    class Local(KeepAll):
        """Defined in a function: not importable by name."""

    registry.add(info("local", target=target_name(Local)), Local)
    assert registry.resolve("local") is Local


def test_local_registration_redefines_its_own_names_and_needs_replace_for_others() -> None:
    registry = Registry()
    registry.add(info("keep", plugin="a"))
    registry.register_local(DropFirstChannel, "drop", kind="structured", summary="Drop", replace=False)

    class Redefined(DropFirstChannel):
        pass

    registry.register_local(Redefined, "drop", kind="structured", summary="Drop", replace=False)
    assert registry.resolve("drop") is Redefined is registry.resolve("local:drop")
    with pytest.raises(ValueError, match=r"already registered by plugin 'a' \(prunereg-a 1.0\)"):
        registry.register_local(KeepAll, "keep", kind="unstructured", summary="Keep", replace=False)
    registry.register_local(KeepAll, "keep", kind="unstructured", summary="Keep", replace=True)
    assert registry.info("keep").plugin == "local"
    assert registry.plugins["local"].methods == ["drop", "keep"]


def test_local_registration_checks_the_class_at_once() -> None:
    registry = Registry()
    with pytest.raises(TypeError, match="PRUNING_TYPE"):
        registry.register_local(KeepAll, "keep", kind="structured", summary="Keep", replace=False)
    with pytest.raises(TypeError, match="BasePruningMethod"):
        registry.register_local(dict, "keep", kind="unstructured", summary="Keep", replace=False)
    assert registry.names() == []


@pytest.mark.parametrize(
    ("name", "kind", "summary"),
    [("", "unstructured", "s"), ("a:b", "unstructured", "s"), ("a b", "unstructured", "s"),
     (3, "unstructured", "s"), ("a", "channel", "s"), ("a", "unstructured", "two\nlines"), ("a", "unstructured", None)],
)
def test_bad_registrations_are_rejected(name: object, kind: object, summary: object) -> None:
    with pytest.raises(ValueError):
        validate_registration(name, kind, summary)


def test_targets_are_module_colon_attribute() -> None:
    assert target_name("pkg.mod:Cls") == "pkg.mod:Cls"
    assert target_name(KeepAll) == "plugin_fakes:KeepAll"
    for bad in ("pkg.mod.Cls", ":Cls", "pkg:"):
        with pytest.raises(ValueError, match="package.module:ClassName"):
            target_name(bad)
    with pytest.raises(TypeError):
        target_name(42)
    assert import_target("prunereg._registry:Registry.add") is Registry.add
