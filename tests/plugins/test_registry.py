"""The Registry on its own: names, conflicts, qualified lookups, lazy resolution, in-process registration."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest

from prunereg._plugins.registry import (
    MethodInfo,
    PluginError,
    PluginWarning,
    Registry,
    UnknownMethodError,
    import_target,
    origin,
    target_name,
    validate_registration,
)
from tests.support.plugin_fakes import MISSING_TARGET, DropFirstChannel, KeepAll

FAKES = "tests.support.plugin_fakes"  # the module the fake targets name


def registry_with_plugins(*names: str, strict: bool = False) -> Registry:
    registry = Registry(strict=strict)
    for name in names:
        assert registry.add_plugin(name, f"prunereg-{name}", "1.0")
    return registry


def register(
    registry: Registry,
    name: str,
    plugin: str = "a",
    target: object = FAKES + ":KeepAll",
    kind: str = "unstructured",
    replace: bool = False,
) -> None:
    registry.register(plugin, name, target, kind=kind, summary=f"The fake {name}", replace=replace)


def test_a_registered_method_is_found_by_name_and_qualified_name() -> None:
    registry = registry_with_plugins("a")
    register(registry, "keep")
    expected = MethodInfo("keep", "unstructured", "The fake keep", "a", "prunereg-a", "1.0", FAKES + ":KeepAll")
    assert registry.info("keep") == registry.info("a:keep") == expected
    assert registry.resolve("keep") is KeepAll
    assert registry.names() == ["keep"]
    assert registry.plugins["a"].methods == ["keep"]
    assert registry.problems == []


def test_the_first_registration_keeps_the_name_and_the_clash_names_both_packages() -> None:
    registry = registry_with_plugins("a", "b")
    register(registry, "keep", plugin="a")
    register(registry, "keep", plugin="b", target=FAKES + ":DropFirstChannel", kind="structured")
    [clash] = registry.problems
    assert clash.startswith(
        "prunereg plugin 'b' (prunereg-b 1.0): method 'keep' conflicts with plugin 'a' (prunereg-a 1.0)"
    )
    assert "'b:keep'" in clash and "replace=True" in clash
    assert (registry.plugins["b"].status, registry.plugins["b"].methods) == ("conflict", ["keep"])
    assert registry.info("keep").plugin == "a"
    assert registry.resolve("b:keep") is DropFirstChannel


def test_replace_takes_a_name_over_once_and_a_second_replace_is_a_clash() -> None:
    registry = registry_with_plugins("a", "b", "c")
    register(registry, "keep", plugin="a")
    register(registry, "keep", plugin="b", replace=True)
    assert registry.info("keep").plugin == "b" and registry.problems == []
    register(registry, "keep", plugin="c", replace=True)
    assert len(registry.problems) == 1 and "took it over with replace=True" in registry.problems[0]
    assert registry.info("keep").plugin == "b"
    assert registry.info("a:keep").plugin == "a"


def test_one_plugin_registering_a_name_twice_keeps_the_first() -> None:
    registry = registry_with_plugins("a")
    register(registry, "keep")
    register(registry, "keep", target=FAKES + ":DropFirstChannel", kind="structured")
    assert "twice" in (registry.plugins["a"].error or "")
    assert registry.resolve("keep") is KeepAll


def test_a_failing_load_withdraws_everything_it_registered_and_its_conflicts() -> None:
    registry = registry_with_plugins("a", "b")
    register(registry, "keep", plugin="a")

    def load(register: Any) -> None:
        register("keep", FAKES + ":KeepAll", kind="unstructured", summary="Mine", replace=True)
        register("other", FAKES + ":KeepAll", kind="unstructured", summary="Other")
        register("other", FAKES + ":KeepAll", kind="unstructured", summary="Twice")  # a conflict, withdrawn too
        raise RuntimeError("boom")

    registry.load_plugin("b", load)
    assert registry.names() == ["keep"]
    assert registry.info("keep").plugin == "a"
    with pytest.raises(UnknownMethodError):
        registry.info("b:other")
    b = registry.plugins["b"]
    assert (b.status, b.methods, b.error) == ("error", [], "failed to load and was skipped: RuntimeError: boom")
    assert registry.problems == [f"prunereg plugin 'b' (prunereg-b 1.0): {b.error}"]
    # The name was never taken over for good: a later plugin may still replace it.
    registry.add_plugin("c", "prunereg-c", "1.0")
    register(registry, "keep", plugin="c", replace=True)
    assert registry.info("keep").plugin == "c"


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt(), SystemExit(0)])
def test_a_load_that_exits_or_raises_keyboard_interrupt_is_a_failed_plugin(raised: BaseException) -> None:
    registry = registry_with_plugins("a")

    def load(register: Any) -> None:
        register("keep", FAKES + ":KeepAll", kind="unstructured", summary="Keep")
        raise raised

    registry.load_plugin("a", load)
    assert (registry.plugins["a"].status, registry.names()) == ("error", [])
    assert type(raised).__name__ in (registry.plugins["a"].error or "")


@pytest.fixture
def terminal_ctrl_c() -> Iterator[None]:
    """Python's own Ctrl-C handler, as in a terminal (a test run started in the background ignores SIGINT)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("terminal_ctrl_c")
def test_the_users_ctrl_c_while_a_plugin_loads_still_stops_the_program() -> None:
    registry = registry_with_plugins("a")

    def load(register: Any) -> None:
        signal.raise_signal(signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        registry.load_plugin("a", load)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_what_a_plugin_prints_while_loading_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    registry = registry_with_plugins("a")
    registry.load_plugin("a", lambda register: print("hello from a plugin"))
    assert capsys.readouterr() == ("", "hello from a plugin\n")


def test_a_plugin_name_is_taken_once_and_local_is_reserved() -> None:
    registry = registry_with_plugins("a")
    assert not registry.add_plugin("a", "prunereg-other", "2.0")
    assert not registry.add_plugin("local", "prunereg-local", "1.0")
    rows = [(key, p.package, p.status) for key, p in registry.plugins.items()]
    assert rows == [
        ("a", "prunereg-a", "loaded"),
        ("a (prunereg-other)", "prunereg-other", "conflict"),
        ("local (prunereg-local)", "prunereg-local", "conflict"),
    ]
    assert "the name is taken by plugin 'a' (prunereg-a 1.0)" in registry.problems[0]
    assert "reserved for in-process registrations" in registry.problems[1]


def test_a_problem_without_a_plugin_is_reported_as_is() -> None:
    registry = Registry()
    assert registry.report("something is off") == "prunereg: something is off"
    assert registry.problems == ["prunereg: something is off"]


def test_every_message_names_a_plugin_the_same_way() -> None:
    assert origin("a", "prunereg-a", "1.0") == "plugin 'a' (prunereg-a 1.0)"
    assert origin("local", None, None) == "plugin 'local' (registered in this process)"
    assert origin("x", None, None) == "plugin 'x' (no installed distribution)"
    assert origin("a\x1b[31m", "pkg\x1b[2J", "1\r") == "plugin 'a\\x1b[31m' (pkg 1\\r)"
    registry = registry_with_plugins("a")
    register(registry, "keep")
    assert registry.info("keep").label == registry.plugins["a"].label == "plugin 'a' (prunereg-a 1.0)"


def test_an_unknown_name_suggests_close_ones() -> None:
    registry = registry_with_plugins("a")
    register(registry, "keep_all")
    with pytest.raises(UnknownMethodError, match=r"'kep_all'.*did you mean 'keep_all'"):
        registry.info("kep_all")
    with pytest.raises(LookupError, match="no pruning method named 'x:keep_all'"):
        registry.resolve("x:keep_all")


def test_an_unimportable_target_is_set_aside_with_a_warning_naming_package_and_version() -> None:
    registry = registry_with_plugins("a")
    register(registry, "gone", target=MISSING_TARGET)
    register(registry, "keep")
    with (
        pytest.warns(PluginWarning, match=r"plugin 'a' \(prunereg-a 1.0\).*'gone'.*ModuleNotFoundError"),
        pytest.raises(UnknownMethodError, match="unavailable") as raised,
    ):
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
    register(registry, "gone", target=MISSING_TARGET)
    with pytest.warns(PluginWarning), pytest.raises(PluginError, match="ModuleNotFoundError"):
        registry.resolve("gone")


@pytest.mark.parametrize(
    ("target", "kind", "message"),
    [
        (FAKES + ":DropFirstChannel", "unstructured", "PRUNING_TYPE 'structured'"),
        (FAKES + ":method", "unstructured", "not a BasePruningMethod subclass"),
        (FAKES + ":NoSuchClass", "unstructured", "AttributeError"),
    ],
)
def test_a_target_of_the_wrong_kind_or_type_is_set_aside(target: str, kind: str, message: str) -> None:
    registry = registry_with_plugins("a")
    register(registry, "bad", target=target, kind=kind)
    with pytest.warns(PluginWarning, match=message), pytest.raises(UnknownMethodError):
        registry.resolve("bad")


def test_check_targets_records_every_failure_without_raising() -> None:
    registry = registry_with_plugins("a", "b")
    register(registry, "keep", plugin="a")
    register(registry, "gone", plugin="b", target=MISSING_TARGET)
    failures = registry.check_targets()
    assert len(failures) == 1 and "prunereg-b 1.0" in failures[0]
    assert (registry.plugins["a"].status, registry.plugins["b"].status) == ("loaded", "error")
    assert registry.check_targets() == []


def test_a_class_target_is_used_as_is() -> None:
    registry = registry_with_plugins("a")

    class Local(KeepAll):
        """Defined in a function: not importable by name."""

    register(registry, "local", target=Local)
    assert registry.info("local").target == target_name(Local)
    assert registry.resolve("local") is Local


def test_a_target_module_that_exits_sets_its_method_aside(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "prunereg_fake_exits.py").write_text("import sys\nprint('leaving')\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = registry_with_plugins("a")
    register(registry, "exits", target="prunereg_fake_exits:Gone")
    register(registry, "keep")
    with pytest.warns(PluginWarning, match="SystemExit: 3"), pytest.raises(UnknownMethodError, match="unavailable"):
        registry.resolve("exits")
    assert capsys.readouterr().out == ""
    assert registry.resolve("keep") is KeepAll


def test_local_registration_redefines_its_own_names_and_needs_replace_for_others() -> None:
    registry = registry_with_plugins("a")
    register(registry, "keep", plugin="a")
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
    [
        ("", "unstructured", "s"),
        ("a:b", "unstructured", "s"),
        ("a b", "unstructured", "s"),
        (3, "unstructured", "s"),
        ("a", "channel", "s"),
        ("a", "unstructured", "two\nlines"),
        ("a", "unstructured", None),
        # Names that look like others or act on a terminal (issue 13, item 8); summaries of two lines however split.
        ("a\r", "unstructured", "s"),
        ("a\x0bb", "unstructured", "s"),
        ("a\xa0b", "unstructured", "s"),
        ("a\u2028b", "unstructured", "s"),
        ("a\x00", "unstructured", "s"),
        ("\x1b[31ma", "unstructured", "s"),
        ("é", "unstructured", "s"),
        ("1st", "unstructured", "s"),
        ("_a", "unstructured", "s"),
        ("a" * 101, "unstructured", "s"),
        ("a", "unstructured", "one\rtwo"),
        ("a", "unstructured", "one\u2028two"),
        ("a", "unstructured", "one\x0btwo"),
    ],
)
def test_bad_registrations_are_rejected(name: object, kind: object, summary: object) -> None:
    with pytest.raises(ValueError):
        validate_registration(name, kind, summary)


@pytest.mark.parametrize("name", ["l1_unstructured", "a", "Wanda-2-4", "n_m_2_4", "a" * 100])
def test_names_of_the_documented_character_set_are_accepted(name: str) -> None:
    validate_registration(name, "unstructured", "  One line, spaces around it are fine \n")


def test_targets_are_module_colon_attribute() -> None:
    assert target_name("pkg.mod:Cls") == "pkg.mod:Cls"
    assert target_name(KeepAll) == FAKES + ":KeepAll"
    for bad in ("pkg.mod.Cls", ":Cls", "pkg:"):
        with pytest.raises(ValueError, match=r"package\.module:ClassName"):
            target_name(bad)
    with pytest.raises(TypeError):
        target_name(42)
    assert import_target("prunereg._plugins.registry:Registry.register") is Registry.register
