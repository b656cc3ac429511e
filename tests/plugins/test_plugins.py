"""Plugin loading with fake entry points: isolation, order, conflicts, switches, strict mode."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any

import pytest

import prunereg
from prunereg._plugins import loading as _plugins
from prunereg._plugins.loading import Settings, load
from prunereg._plugins.registry import PluginError, PluginWarning, UnknownMethodError
from tests.support.plugin_fakes import MISSING_TARGET, DropFirstChannel, KeepAll, builtins, method, plugin

FAKES = "tests.support.plugin_fakes"  # the module the fake targets name

BUILTIN_NAMES = [
    "custom_from_mask",
    "identity",
    "l1_unstructured",
    "ln_structured",
    "random_structured",
    "random_unstructured",
]
# prunereg's second built-in plugin (plugins/prunereg_llm): calibrated methods, also loaded with autoload off.
LLM_NAMES = ["magnitude", "sparsegpt", "wanda"]
SHRINK_NAMES = ["block_influence", "flap", "magnitude_sp", "reap", "wanda_sp"]
RECOVER_NAMES = ["blockwise", "distill", "refit", "replace"]


def statuses(registry: prunereg._plugins.registry.Registry) -> dict[str, str]:
    return {name: plugin.status for name, plugin in registry.plugins.items()}


def test_a_good_plugin_adds_its_methods_next_to_the_builtins() -> None:
    registry = load(
        [
            builtins(),
            plugin("good", method("keep"), method("drop", FAKES + ":DropFirstChannel", kind="structured")),
        ]
    )
    assert registry.names() == sorted([*BUILTIN_NAMES, "drop", "keep"])
    assert registry.resolve("drop") is DropFirstChannel
    info = registry.info("keep")
    assert (info.plugin, info.package, info.version, info.target) == (
        "good",
        "prunereg-good",
        "1.0",
        FAKES + ":KeepAll",
    )
    assert registry.plugins["good"].methods == ["keep", "drop"]
    assert statuses(registry) == {"builtins": "loaded", "good": "loaded"}
    assert registry.problems == []


def test_plugins_load_builtins_first_then_by_distribution_then_entry_point_name() -> None:
    points = [
        plugin("z", package="Prunereg_Alpha"),
        plugin("b", package="prunereg-beta"),
        builtins(),
        plugin("a", package="prunereg-beta"),
        plugin("y", package="prunereg-alpha-two"),
    ]
    order = list(load(points).plugins)
    assert order == ["builtins", "z", "y", "a", "b"]
    assert order == list(load(reversed(points)).plugins)


def test_a_plugin_that_fails_to_import_is_reported_and_skipped() -> None:
    registry = load(
        [
            builtins(),
            plugin("broken", import_error=ImportError("No module named 'scipy'")),
            plugin("good", method("keep")),
        ]
    )
    broken = registry.plugins["broken"]
    assert (broken.status, broken.methods) == ("error", [])
    assert "ImportError: No module named 'scipy'" in (broken.error or "")
    assert registry.problems == [f"prunereg plugin 'broken' (prunereg-broken 1.0): {broken.error}"]
    assert registry.resolve("keep") is KeepAll
    assert "l1_unstructured" in registry.names()


def test_a_raising_hook_withdraws_every_method_it_registered() -> None:
    registry = load(
        [
            builtins(),
            plugin("first", method("keep")),
            plugin(
                "raising",
                method("new"),
                method("keep", replace=True),
                method("l1_unstructured", replace=True),
                raises=RuntimeError("boom"),
            ),
            plugin("later", method("new", FAKES + ":DropFirstChannel", kind="structured")),
        ]
    )
    raising = registry.plugins["raising"]
    assert (raising.status, raising.methods) == ("error", [])
    assert "RuntimeError: boom" in (raising.error or "")
    assert registry.info("keep").plugin == "first"
    assert registry.info("l1_unstructured").plugin == "builtins"
    assert registry.info("new").plugin == "later"
    with pytest.raises(UnknownMethodError):
        registry.info("raising:new")
    assert statuses(registry) == {"builtins": "loaded", "first": "loaded", "raising": "error", "later": "loaded"}


@pytest.mark.parametrize(
    ("registration", "message"),
    [
        (method("bad kind", kind="unstructured"), "ValueError: method name"),
        (method("keep", kind="pointwise"), "ValueError: kind must be one of"),
        (method("keep", "tests.support.plugin_fakes.KeepAll"), "ValueError: target"),
    ],
)
def test_an_invalid_registration_fails_its_plugin_only(registration: dict, message: str) -> None:
    registry = load([builtins(), plugin("bad", method("fine"), registration)])
    assert registry.plugins["bad"].status == "error"
    assert message in (registry.plugins["bad"].error or "")
    assert registry.names() == BUILTIN_NAMES


def test_a_module_without_a_valid_hook_is_an_error_not_a_silent_skip() -> None:
    import types

    empty = types.ModuleType("prunereg_fake_empty")
    misspelled = types.ModuleType("prunereg_fake_misspelled")
    misspelled.prunereg_register_method = prunereg.hookimpl(lambda register: None)
    wrong_arguments = types.ModuleType("prunereg_fake_arguments")
    wrong_arguments.prunereg_register_methods = prunereg.hookimpl(lambda register, extra: None)
    registry = load(
        [
            plugin("empty", module=empty),
            plugin("misspelled", module=misspelled),
            plugin("arguments", module=wrong_arguments),
        ]
    )
    assert statuses(registry) == {"empty": "error", "misspelled": "error", "arguments": "error"}
    assert "defines no prunereg_register_methods hook" in (registry.plugins["empty"].error or "")
    assert "prunereg_register_method" in (registry.plugins["misspelled"].error or "")
    assert "extra" in (registry.plugins["arguments"].error or "")


def test_a_hook_taking_no_arguments_is_fine() -> None:
    import types

    quiet = types.ModuleType("prunereg_fake_quiet")
    quiet.prunereg_register_methods = prunereg.hookimpl(lambda: None)
    registry = load([plugin("quiet", module=quiet)])
    assert statuses(registry) == {"quiet": "loaded"}


def test_an_unimportable_target_leaves_the_other_methods_working() -> None:
    registry = load([builtins(), plugin("partial", method("gone", MISSING_TARGET), method("keep"))])
    assert registry.problems == []  # targets are imported on first use only
    with (
        pytest.warns(PluginWarning, match=r"plugin 'partial' \(prunereg-partial 1.0\).*'gone'"),
        pytest.raises(UnknownMethodError),
    ):
        registry.resolve("gone")
    assert registry.resolve("keep") is KeepAll
    assert registry.resolve("l1_unstructured").__name__ == "L1Unstructured"
    assert registry.plugins["partial"].status == "error"


def test_a_duplicate_name_is_a_conflict_naming_both_packages_and_the_first_wins() -> None:
    registry = load(
        [
            plugin("b", method("keep", FAKES + ":DropFirstChannel", kind="structured")),
            plugin("a", method("keep")),
        ]
    )
    assert registry.resolve("keep") is KeepAll  # prunereg-a sorts before prunereg-b
    assert registry.resolve("b:keep") is DropFirstChannel
    loser = registry.plugins["b"]
    assert (loser.status, loser.methods) == ("conflict", ["keep"])
    assert "plugin 'a' (prunereg-a 1.0)" in (loser.error or "")
    assert registry.problems == [f"prunereg plugin 'b' (prunereg-b 1.0): {loser.error}"]
    assert registry.plugins["a"].status == "loaded"


def test_replace_overrides_a_builtin_deliberately_and_silently() -> None:
    registry = load([builtins(), plugin("faster", method("l1_unstructured", replace=True))])
    assert registry.resolve("l1_unstructured") is KeepAll
    assert registry.resolve("builtins:l1_unstructured").__name__ == "L1Unstructured"
    assert registry.problems == []


def test_a_second_replace_of_one_name_is_a_conflict() -> None:
    registry = load(
        [
            builtins(),
            plugin("one", method("identity", replace=True)),
            plugin(
                "two",
                method("identity", FAKES + ":DropFirstChannel", kind="structured", replace=True),
            ),
        ]
    )
    assert registry.info("identity").plugin == "one"
    assert registry.plugins["two"].status == "conflict"
    assert "plugin 'one' (prunereg-one 1.0), which took it over" in (registry.plugins["two"].error or "")


def test_two_distributions_with_one_plugin_name_keep_the_first() -> None:
    registry = load(
        [
            plugin("same", method("first"), package="prunereg-a"),
            plugin("same", method("second"), package="prunereg-b"),
            plugin("local", method("third")),
        ]
    )
    assert registry.names() == ["first"]
    rows = [(p.name, p.package, p.status) for p in registry.plugins.values()]
    assert rows == [
        ("same", "prunereg-a", "loaded"),
        ("same", "prunereg-b", "conflict"),
        ("local", "prunereg-local", "conflict"),
    ]
    assert any("reserved for in-process registrations" in problem for problem in registry.problems)


def test_a_blocked_plugin_is_not_imported() -> None:
    blocked = plugin("blocked", import_error=AssertionError("must not be imported"))
    registry = load([builtins(), blocked, plugin("good", method("keep"))], Settings(block=frozenset({"blocked"})))
    assert statuses(registry) == {"builtins": "loaded", "blocked": "blocked", "good": "loaded"}
    assert registry.problems == []


def test_blocking_by_distribution_name_and_blocking_the_builtins() -> None:
    settings = Settings.from_env({"PRUNEREG_BLOCK_PLUGINS": "Prunereg_Good, builtins"})
    registry = load([builtins(), plugin("good", method("keep"))], settings)
    assert statuses(registry) == {"builtins": "blocked", "good": "blocked"}
    assert registry.names() == []


def test_autoload_off_loads_only_the_builtins() -> None:
    settings = Settings.from_env({"PRUNEREG_DISABLE_PLUGIN_AUTOLOAD": "1"})
    registry = load(
        [builtins(), plugin("good", method("keep"), import_error=AssertionError("must not load"))], settings
    )
    assert statuses(registry) == {"builtins": "loaded", "good": "disabled"}
    assert registry.names() == BUILTIN_NAMES


def test_the_allowlist_loads_the_builtins_and_the_named_plugins_and_reports_unknown_names() -> None:
    settings = Settings.from_env(
        {"PRUNEREG_PLUGINS": "one,prunereg-two,nosuch", "PRUNEREG_DISABLE_PLUGIN_AUTOLOAD": "1"}
    )
    registry = load(
        [builtins(), plugin("one", method("a")), plugin("two", method("b")), plugin("three", method("c"))], settings
    )
    assert statuses(registry) == {"builtins": "loaded", "one": "loaded", "two": "loaded", "three": "disabled"}
    assert registry.problems == [
        "prunereg: PRUNEREG_PLUGINS names 'nosuch', but no installed plugin or distribution has that name "
        "(see `prunereg plugins`)"
    ]


def test_an_empty_allowlist_loads_no_third_party_plugin() -> None:
    registry = load([builtins(), plugin("one", method("a"))], Settings.from_env({"PRUNEREG_PLUGINS": ""}))
    assert statuses(registry) == {"builtins": "loaded", "one": "disabled"}
    assert registry.problems == []


@pytest.mark.parametrize(
    ("value", "expected"), [("1", True), ("true", True), ("YES", True), ("0", False), ("", False), (None, False)]
)
def test_switch_values(value: str | None, expected: bool) -> None:
    env = {} if value is None else {"PRUNEREG_STRICT_PLUGINS": value, "PRUNEREG_DISABLE_PLUGIN_AUTOLOAD": value}
    settings = Settings.from_env(env)
    assert (settings.strict, settings.autoload) == (expected, not expected)


def test_the_real_entry_points_include_the_builtins_of_prunereg_itself() -> None:
    points = _plugins.entry_points()
    builtin = [p for p in points if p.name == "builtins"]
    assert len(builtin) == 1
    assert (builtin[0].dist.name, builtin[0].value) == ("prunereg", "prunereg_builtins")


@pytest.mark.usefixtures("fresh_registry")
def test_the_process_registry_loads_once_lazily_and_honours_the_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRUNEREG_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert _plugins._registry is None
    assert prunereg.list_methods() == sorted([*BUILTIN_NAMES, *LLM_NAMES, *SHRINK_NAMES, *RECOVER_NAMES])
    assert prunereg.list_methods("structured") == ["ln_structured", "random_structured"]
    loaded = _plugins.registry()
    assert _plugins.registry() is loaded
    assert {p.status for p in loaded.plugins.values() if p.package != "prunereg"} <= {"disabled"}
    assert prunereg.info("l1_unstructured").package == "prunereg"


@pytest.mark.usefixtures("fresh_registry")
def test_strict_mode_raises_on_every_use_and_lenient_mode_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = load([builtins(), plugin("broken", import_error=ImportError("nope"))], Settings(strict=True))
    monkeypatch.setattr(_plugins, "_registry", broken)
    for _ in range(2):
        with pytest.raises(PluginError, match=r"plugin 'broken' \(prunereg-broken 1.0\).*ImportError: nope"):
            prunereg.get("l1_unstructured")
    lenient = load([builtins(), plugin("broken", import_error=ImportError("nope"))], Settings(strict=False))
    monkeypatch.setattr(_plugins, "_registry", lenient)
    with pytest.warns(PluginWarning, match="ImportError: nope"):
        assert prunereg.get("l1_unstructured").__name__ == "L1Unstructured"
    assert prunereg.get("identity").__name__ == "Identity"  # reported once: no second warning (it would fail here)


@pytest.mark.usefixtures("fresh_registry")
def test_register_decorator_adds_a_method_in_process() -> None:
    @prunereg.register("keep_everything")
    class KeepEverything(KeepAll):
        """Prune nothing, registered from a test."""

    assert prunereg.get("keep_everything") is KeepEverything
    assert prunereg.get("local:keep_everything") is KeepEverything
    info = prunereg.info("keep_everything")
    assert (info.kind, info.summary, info.plugin, info.package) == (
        "unstructured",
        "Prune nothing, registered from a test.",
        "local",
        None,
    )

    with pytest.raises(ValueError, match="already registered by plugin 'builtins'"):
        prunereg.register("l1_unstructured", summary="Mine")(KeepAll)

    prunereg.register("l1_unstructured", summary="Mine", replace=True)(KeepAll)
    assert prunereg.get("l1_unstructured") is KeepAll
    assert prunereg.get("builtins:l1_unstructured").__name__ == "L1Unstructured"


def test_import_prunereg_imports_neither_torch_nor_pluggy_nor_plugins() -> None:
    import subprocess

    code = (
        "import sys, prunereg; print(sorted(m for m in sys.modules if m.startswith(('torch', 'pluggy', 'prunereg'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # prunereg._legacy is the finder that keeps prunereg 0.1's pickles loading: stdlib only.
    assert result.stdout.strip() == "['prunereg', 'prunereg._legacy']"


# -- plugins that exit, interrupt, print or call back into prunereg while loading (issue 13, items 2 and 7) --


def exit_with(code: int) -> None:
    sys.exit(code)


@pytest.mark.parametrize(
    "misbehaving",
    [
        plugin("bad", method("mine"), import_error=SystemExit(3)),
        plugin("bad", method("mine"), on_import=lambda: exit_with(0)),
        plugin("bad", method("mine"), raises=SystemExit(2)),
        plugin("bad", method("mine"), raises=KeyboardInterrupt()),
        plugin("bad", method("mine"), in_hook=lambda: exit_with(1)),
    ],
    ids=[
        "SystemExit at import",
        "sys.exit at import",
        "SystemExit in the hook",
        "KeyboardInterrupt in the hook",
        "sys.exit in the hook",
    ],
)
def test_a_plugin_that_exits_or_interrupts_is_a_failed_plugin_and_the_rest_loads(misbehaving: Any) -> None:
    registry = load([builtins(), misbehaving, plugin("good", method("keep"))])
    bad = registry.plugins["bad"]
    assert (bad.status, bad.methods) == ("error", [])
    assert (bad.error or "").startswith("failed to load and was skipped: ")
    assert any(kind in (bad.error or "") for kind in ("SystemExit", "KeyboardInterrupt"))
    assert registry.names() == sorted([*BUILTIN_NAMES, "keep"])


def test_what_a_plugin_prints_while_loading_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    registry = load(
        [
            builtins(),
            plugin("chatty", method("keep"), on_import=lambda: print("imported!"), in_hook=lambda: print("hooked!")),
        ]
    )
    assert registry.plugins["chatty"].status == "loaded"
    assert capsys.readouterr() == ("", "imported!\nhooked!\n")


@pytest.mark.usefixtures("fresh_registry")
def test_prunereg_register_while_a_plugin_loads_registers_for_that_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    def register_at_import() -> None:
        prunereg.register("at_import", summary="Registered at import")(KeepAll)

    points = [
        builtins(),
        plugin("eager", module=types.ModuleType("prunereg_fake_eager"), on_import=register_at_import),
        plugin("hooked", in_hook=lambda: prunereg.register("in_hook", summary="In the hook")(DropFirstChannel)),
    ]
    monkeypatch.setattr(_plugins, "entry_points", lambda: points)
    assert prunereg.list_methods() == sorted([*BUILTIN_NAMES, "at_import", "in_hook"])
    registry = _plugins.registry()
    assert registry.problems == []
    assert statuses(registry) == {"builtins": "loaded", "eager": "loaded", "hooked": "loaded"}
    info = prunereg.info("at_import")
    assert (info.plugin, info.package, info.version) == ("eager", "prunereg-eager", "1.0")
    assert prunereg.get("hooked:in_hook") is DropFirstChannel


@pytest.mark.usefixtures("fresh_registry")
def test_a_hook_asking_for_the_methods_sees_those_loaded_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    points = [
        builtins(),
        plugin("first", method("keep")),
        plugin("second", method("drop"), in_hook=lambda: seen.append(prunereg.list_methods())),
    ]
    monkeypatch.setattr(_plugins, "entry_points", lambda: points)
    assert prunereg.list_methods() == sorted([*BUILTIN_NAMES, "drop", "keep"])
    assert seen == [sorted([*BUILTIN_NAMES, "keep"])]
    assert _plugins.registry().problems == []


@pytest.mark.usefixtures("fresh_registry")
def test_a_plugin_imported_by_the_user_that_registers_at_import_keeps_its_method(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `import prunereg_fake_direct` by the user, whose module code calls prunereg.register before plugins loaded:
    # loading finds the module mid-import (importlib's mark), and the registration that follows is the plugin's.
    module = types.ModuleType("prunereg_fake_direct")
    module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    module.__spec__._initializing = True  # type: ignore[attr-defined]  (what importlib sets during an import)
    monkeypatch.setattr(_plugins, "entry_points", lambda: [builtins(), plugin("direct", module=module)])
    module_code = "prunereg.register('direct_method', summary='Registered at import')(KeepAll)"
    exec(module_code, {"__name__": "prunereg_fake_direct", "prunereg": prunereg, "KeepAll": KeepAll})
    info = prunereg.info("direct_method")
    assert (info.plugin, info.package) == ("direct", "prunereg-direct")
    assert _plugins.registry().problems == []
    assert _plugins.registry().plugins["direct"].methods == ["direct_method"]


def test_a_plugin_with_no_hook_that_registered_nothing_is_still_an_error() -> None:
    registry = load([plugin("empty", module=types.ModuleType("prunereg_fake_empty"), on_import=lambda: None)])
    assert registry.plugins["empty"].status == "error"
