"""`prunereg list / plugins / info / new-plugin`: in-process with CliRunner, and as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

import prunereg
from prunereg._cli import main
from prunereg._plugins import loading as _plugins
from prunereg._plugins.loading import Settings, load
from tests.support.plugin_fakes import MISSING_TARGET, KeepAll, builtins, fake_install, method, plugin, site_env

METHOD_KEYS = {"name", "kind", "summary", "plugin", "package", "version", "target"}
PLUGIN_KEYS = {"name", "package", "version", "status", "methods", "error"}


@pytest.fixture
def use_plugins(monkeypatch: pytest.MonkeyPatch, fresh_registry: None):
    """Make the CLI see a registry loaded from the given fake entry points."""

    def use(*points, strict: bool = False, block: frozenset[str] = frozenset()):
        monkeypatch.setattr(_plugins, "_registry", load(points, Settings(strict=strict, block=block)))

    return use


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_list_shows_a_table_of_every_method(use_plugins) -> None:
    use_plugins(builtins(), plugin("good", method("keep", summary="Keep everything")))
    result = run("list")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "KIND", "RUNS", "WITH", "PACKAGE", "VERSION", "SUMMARY"]
    assert lines[1].split()[:5] == ["custom_from_mask", "global", "prune", "prunereg", prunereg.__version__]
    assert "keep                 unstructured  prune, prune --global  prunereg-good  1.0      Keep everything" in (
        result.stdout
    )
    assert len(lines) == 8


def test_list_json_is_a_flat_list_with_every_key_present(use_plugins) -> None:
    use_plugins(builtins(), plugin("good", method("keep"), package="prunereg-good"))
    rows = json.loads(run("list", "--json").stdout)
    assert [row["name"] for row in rows] == sorted(row["name"] for row in rows)
    assert all(set(row) == METHOD_KEYS | {"runs_with"} for row in rows)
    assert {
        "name": "keep",
        "kind": "unstructured",
        "runs_with": "prune, prune --global",
        "summary": "The fake keep",
        "plugin": "good",
        "package": "prunereg-good",
        "version": "1.0",
        "target": "tests.support.plugin_fakes:KeepAll",
    } in rows


@pytest.mark.usefixtures("fresh_registry")
def test_list_json_keeps_null_keys_for_in_process_methods() -> None:
    from tests.support.plugin_fakes import KeepAll

    prunereg.register("keep_local")(KeepAll)
    rows = json.loads(run("list", "--json").stdout)
    local = next(row for row in rows if row["name"] == "keep_local")
    assert local == {
        "name": "keep_local",
        "kind": "unstructured",
        "runs_with": "prune, prune --global",
        "summary": "Prune nothing (a fake unstructured method).",
        "plugin": "local",
        "package": None,
        "version": None,
        "target": "tests.support.plugin_fakes:KeepAll",
    }


def test_list_filters_by_kind(use_plugins) -> None:
    use_plugins(builtins())
    assert [row["name"] for row in json.loads(run("list", "--json", "--kind", "structured").stdout)] == [
        "ln_structured",
        "random_structured",
    ]
    assert run("list", "--kind", "pointwise").exit_code == 2


def test_list_reports_broken_plugins_on_stderr_and_exits_0(use_plugins) -> None:
    use_plugins(builtins(), plugin("broken", import_error=ImportError("nope")))
    result = run("list", "--json")
    assert result.exit_code == 0
    assert len(json.loads(result.stdout)) == 6
    assert (
        "warning: prunereg plugin 'broken' (prunereg-broken 1.0): failed to load and was skipped: ImportError: nope"
        in result.stderr
    )


def test_list_exits_non_zero_in_strict_mode(use_plugins) -> None:
    use_plugins(builtins(), plugin("broken", import_error=ImportError("nope")), strict=True)
    result = run("list")
    assert result.exit_code == 1
    assert "custom_from_mask" in result.stdout
    assert "ImportError: nope" in result.stderr and "PRUNEREG_STRICT_PLUGINS" in result.stderr


def test_plugins_shows_each_status(use_plugins) -> None:
    use_plugins(
        builtins(),
        plugin("broken", import_error=ImportError("nope")),
        plugin("clash", method("identity")),
        plugin("partial", method("gone", MISSING_TARGET), method("fine")),
        plugin("blocked"),
        block=frozenset({"blocked"}),
    )
    result = run("plugins", "--json")
    assert result.exit_code == 0
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert all(set(row) == PLUGIN_KEYS for row in rows.values())
    assert {name: row["status"] for name, row in rows.items()} == {
        "builtins": "loaded",
        "blocked": "blocked",
        "broken": "error",
        "clash": "conflict",
        "partial": "error",
    }
    assert rows["partial"]["methods"] == ["gone", "fine"]
    assert "'gone' is unavailable" in rows["partial"]["error"] and "ModuleNotFoundError" in rows["partial"]["error"]
    assert rows["builtins"]["error"] is None
    assert "'gone' is unavailable" in result.stderr


def test_plugins_table(use_plugins) -> None:
    use_plugins(builtins(), plugin("broken", import_error=ImportError("nope")))
    lines = run("plugins").stdout.splitlines()
    assert lines[0].split() == ["NAME", "PACKAGE", "VERSION", "STATUS", "METHODS", "ERROR"]
    assert lines[1].startswith("builtins") and "loaded" in lines[1] and "l1_unstructured" in lines[1]
    assert lines[2].split()[:4] == ["broken", "prunereg-broken", "1.0", "error"] and lines[2].endswith(
        "ImportError: nope"
    )


def test_plugins_exits_non_zero_in_strict_mode_on_a_broken_target(use_plugins) -> None:
    use_plugins(builtins(), plugin("partial", method("gone", MISSING_TARGET)), strict=True)
    assert run("plugins").exit_code == 1


def test_info_describes_a_method(use_plugins) -> None:
    use_plugins(builtins())
    result = run("info", "ln_structured")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[:4] == [
        "ln_structured (structured): Prune whole channels along a dim with the lowest Ln-norm",
        f"from plugin 'builtins' (prunereg {prunereg.__version__}), class prunereg_builtins.structured:LnStructured",
        "runs with: prunereg prune",
        "parameters: amount: numbers.Real, n: int | float | str, dim: int = -1",
    ]
    assert "lowest ``n``-norm" in result.stdout


def test_info_json(use_plugins) -> None:
    use_plugins(builtins())
    details = json.loads(run("info", "builtins:random_structured", "--json").stdout)
    assert set(details) == METHOD_KEYS | {"runs_with", "doc", "parameters"}
    assert details["runs_with"] == ["prune"]
    assert details["doc"].startswith("Prune ``amount`` channels")
    assert details["parameters"] == [
        {"name": "amount", "annotation": "numbers.Real", "default": None, "required": True},
        {"name": "dim", "annotation": "int", "default": "-1", "required": False},
    ]
    assert json.loads(run("info", "identity", "--json").stdout)["parameters"] == []


def test_info_on_an_unknown_or_broken_method_fails_clearly(use_plugins) -> None:
    use_plugins(builtins(), plugin("partial", method("gone", MISSING_TARGET)))
    unknown = run("info", "l1_unstrctured")
    assert unknown.exit_code == 1 and "did you mean 'l1_unstructured'" in unknown.stderr
    broken = run("info", "gone")
    assert broken.exit_code == 1
    assert "prunereg-partial 1.0" in broken.stderr and "ModuleNotFoundError" in broken.stderr


def test_new_plugin_writes_a_complete_package(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["new-plugin", "prunereg-foo-bar", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    written = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert written == [
        "README.md",
        "prunereg_foo_bar/__init__.py",
        "prunereg_foo_bar/method.py",
        "pyproject.toml",
        "tests/test_foo_bar.py",
    ]
    pyproject = (tmp_path / "out" / "pyproject.toml").read_text()
    assert 'name = "prunereg-foo-bar"' in pyproject
    assert '[project.entry-points.prunereg]\nfoo_bar = "prunereg_foo_bar"' in pyproject
    assert "{{" not in "".join(p.read_text() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert (
        "class FooBarPruning(prunereg.BasePruningMethod)"
        in (tmp_path / "out" / "prunereg_foo_bar" / "method.py").read_text()
    )


def test_new_plugin_defaults_to_a_folder_named_after_the_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(main, ["new-plugin", "baz"]).exit_code == 0
    assert (tmp_path / "prunereg-baz" / "prunereg_baz" / "__init__.py").is_file()


def test_new_plugin_refuses_bad_names_and_non_empty_folders(tmp_path: Path) -> None:
    for bad in ("Foo", "9lives", "a b", "prunereg-", "foo--bar"):
        result = CliRunner().invoke(main, ["new-plugin", bad, str(tmp_path / "x")])
        assert result.exit_code == 2 and "not a plugin name" in result.output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    result = CliRunner().invoke(main, ["new-plugin", "foo", str(tmp_path / "full")])
    assert result.exit_code == 1 and "not empty" in result.output
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]


# -- a real process -----------------------------------------------------------------

PROBE = """
import json, sys
from prunereg._cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""


def run_probe(*args: str) -> tuple[str, list[str]]:
    """Run the CLI in a fresh interpreter; its stdout and the modules it imported."""
    result = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, check=True)
    return result.stdout, json.loads(result.stderr.rpartition("MODULES ")[2])


@pytest.mark.parametrize("args", [("--help",), ("list",), ("list", "--json"), ("list", "--kind", "global")])
def test_help_and_list_import_neither_torch_nor_plugin_implementations(args: tuple[str, ...]) -> None:
    stdout, modules = run_probe(*args)
    assert stdout
    assert not [m for m in modules if m == "torch" or m.startswith("torch.")]
    entry_point_modules = {p.value.partition(":")[0] for p in _plugins.entry_points()}
    targets = {row["target"].partition(":")[0] for row in json.loads(run_probe("list", "--json")[0])}
    assert targets - entry_point_modules  # the built-ins' classes live in their own modules
    assert not (targets - entry_point_modules) & set(modules)


def script(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The installed `prunereg` console script, as a user runs it."""
    executable = Path(sys.executable).with_name("prunereg")
    return subprocess.run([str(executable), *args], capture_output=True, text=True, env={**os.environ, **env})


def test_the_console_script_lists_the_installed_builtins() -> None:
    result = script("list", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["l1_unstructured"] == {
        "name": "l1_unstructured",
        "kind": "unstructured",
        "runs_with": "prune, prune --global",
        "summary": "Prune the entries of smallest absolute value",
        "plugin": "builtins",
        "package": "prunereg",
        "version": prunereg.__version__,
        "target": "prunereg_builtins.unstructured:L1Unstructured",
    }


@pytest.mark.slow
def test_the_console_script_honours_the_switches() -> None:
    blocked = script("plugins", "--json", PRUNEREG_BLOCK_PLUGINS="builtins")
    assert {row["name"]: row["status"] for row in json.loads(blocked.stdout)}["builtins"] == "blocked"
    nothing = script("list", "--json", PRUNEREG_BLOCK_PLUGINS="builtins,llm,shrink,recover", PRUNEREG_PLUGINS="")
    assert json.loads(nothing.stdout) == []

    lenient = script("list", PRUNEREG_PLUGINS="nosuch", PRUNEREG_STRICT_PLUGINS="0")
    assert lenient.returncode == 0
    assert "PRUNEREG_PLUGINS names 'nosuch'" in lenient.stderr and "l1_unstructured" in lenient.stdout
    strict = script("list", PRUNEREG_PLUGINS="nosuch", PRUNEREG_STRICT_PLUGINS="1")
    assert strict.returncode == 1 and "PRUNEREG_PLUGINS names 'nosuch'" in strict.stderr


@pytest.mark.slow
def test_installed_broken_and_clashing_plugins_never_break_the_cli(tmp_path: Path) -> None:
    fake_install(tmp_path, "prunereg_broken", "raise ImportError('needs scipy')\n")
    fake_install(
        tmp_path,
        "prunereg_clash",
        (
            "import prunereg\n\n"
            "@prunereg.hookimpl\n"
            "def prunereg_register_methods(register):\n"
            "    register('l1_unstructured', 'prunereg_builtins.unstructured:Identity', kind='unstructured',\n"
            "             summary='Clash')\n"
        ),
        version="2.5",
    )
    env = site_env(tmp_path)

    lenient = script("list", "--json", **env, PRUNEREG_STRICT_PLUGINS="0")
    assert lenient.returncode == 0
    rows = {row["name"]: row for row in json.loads(lenient.stdout)}
    assert rows["l1_unstructured"]["package"] == "prunereg"
    assert (
        "plugin 'broken' (prunereg-broken 1.0): failed to load and was skipped: ImportError: needs scipy"
        in lenient.stderr
    )
    assert (
        "plugin 'clash' (prunereg-clash 2.5): method 'l1_unstructured' conflicts with plugin 'builtins' (prunereg"
        in lenient.stderr
    )

    statuses = {row["name"]: row["status"] for row in json.loads(script("plugins", "--json", **env).stdout)}
    assert (statuses["builtins"], statuses["broken"], statuses["clash"]) == ("loaded", "error", "conflict")

    strict = script("list", **env, PRUNEREG_STRICT_PLUGINS="1")
    assert strict.returncode == 1 and "l1_unstructured" in strict.stdout

    code = "import prunereg; print(prunereg.get('l1_unstructured').__name__)"
    used = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "PRUNEREG_STRICT_PLUGINS": "0"},
    )
    assert used.stdout == "L1Unstructured\n"
    assert "PluginWarning" in used.stderr and "needs scipy" in used.stderr


# -- hostile text, unreadable signatures, strict info (issue 13, items 6, 7, 8 and 9) ----------------------------


class _NoSignature(type(prunereg.BasePruningMethod)):
    @property
    def __signature__(cls) -> None:
        raise RuntimeError("no signature here")


class Unreadable(KeepAll, metaclass=_NoSignature):
    """Its constructor's signature cannot be read."""


class BadDefault(KeepAll):
    class _Unprintable:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    def __init__(self, amount: float = 0.5, weird: object = _Unprintable()) -> None:
        self.amount = amount


class Unresolvable(KeepAll):
    def __init__(self, amount: torch.NoSuchType = 0.5) -> None:  # type: ignore[name-defined]  (the point of the test)
        self.amount = amount


@pytest.mark.parametrize("cls", [Unreadable, BadDefault])
def test_info_answers_when_a_signature_cannot_be_read(use_plugins, cls: type) -> None:
    use_plugins(builtins(), plugin("odd", method("odd", cls)))
    result = run("info", "odd")
    assert result.exit_code == 0
    assert "parameters: unknown (the constructor's signature cannot be read)" in result.stdout.splitlines()
    assert json.loads(run("info", "odd", "--json").stdout)["parameters"] is None


def test_info_shows_annotations_that_cannot_be_resolved_as_written(use_plugins) -> None:
    use_plugins(builtins(), plugin("odd", method("odd", Unresolvable)))
    assert "parameters: amount: torch.NoSuchType = 0.5" in run("info", "odd").stdout.splitlines()


def test_prune_reads_the_raw_signature_when_annotations_cannot_be_resolved(use_plugins, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    use_plugins(builtins(), plugin("odd", method("odd", Unresolvable)))
    save_file({"w": torch.arange(1.0, 17.0).reshape(4, 4)}, str(tmp_path / "in.safetensors"))
    prune = ["prune", str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors"), "--method", "odd"]
    assert run(*prune, "--amount", "0.5").exit_code == 0
    assert (tmp_path / "out.safetensors").is_file()
    unknown = CliRunner().invoke(main, [*prune, "--arg", "ratio=2", "--force"])
    assert unknown.exit_code == 1 and "does not take argument 'ratio' (it takes: amount)" in unknown.stderr


def test_strict_info_exits_non_zero_when_a_plugin_failed(use_plugins) -> None:
    use_plugins(builtins(), plugin("broken", import_error=ImportError("nope")), strict=True)
    result = run("info", "l1_unstructured")
    assert result.exit_code == 1
    assert result.stdout.startswith("l1_unstructured (unstructured)")
    assert "ImportError: nope" in result.stderr and "PRUNEREG_STRICT_PLUGINS" in result.stderr


HOSTILE = "\x1b[31mred\x1b[0m \x1b]0;title\x07 \x1b[2J bell\x07 nbsp\xa0 tab\t end"


def test_nothing_a_plugin_wrote_reaches_the_terminal_raw(use_plugins) -> None:
    class Loud(KeepAll):
        __doc__ = f"Doc {HOSTILE}\nsecond line\r overwritten"

    use_plugins(
        builtins(),
        plugin("loud\x1b[1m", method("loud", Loud, summary=f"Summary {HOSTILE}"), package="prunereg-loud\x1b[5m"),
        plugin("broken", import_error=ImportError(f"cannot import {HOSTILE}\r\nsecond line")),
    )
    outputs = [run("list"), run("plugins"), run("info", "loud")]
    for result in outputs:
        assert result.exit_code == 0
        printed = result.stdout + result.stderr
        assert not {"\x1b", "\x07", "\r", "\xa0", "\t"} & set(printed), printed
    assert "Summary red   bell\\x07 nbsp\\xa0 tab\\t end" in outputs[0].stdout
    assert "cannot import red   bell\\x07 nbsp\\xa0 tab\\t end second line" in outputs[0].stderr
    assert (
        "Doc red   bell\\x07 nbsp" in outputs[2].stdout
        and "plugin 'loud\\x1b[1m' (prunereg-loud 1.0)" in outputs[2].stdout
    )
    listed = {row["name"]: row for row in json.loads(run("list", "--json").stdout)}
    assert listed["loud"]["summary"] == f"Summary {HOSTILE}"  # JSON escapes it; the data stays as registered


def test_new_plugin_prints_a_pip_command_for_the_local_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    default = CliRunner().invoke(main, ["new-plugin", "baz"])
    assert "  pip install ./prunereg-baz && prunereg list && python -m pytest ./prunereg-baz" in default.stdout
    spaced = CliRunner().invoke(main, ["new-plugin", "qux", "my plugins/qux"])
    assert "pip install './my plugins/qux'" in spaced.stdout
    absolute = CliRunner().invoke(main, ["new-plugin", "quux", str(tmp_path / "abs")])
    assert f"pip install {tmp_path / 'abs'} " in absolute.stdout


def test_new_plugin_reports_names_and_folders_too_long_for_the_filesystem_in_one_line(tmp_path: Path) -> None:
    long_name = CliRunner().invoke(main, ["new-plugin", "a" * 300, str(tmp_path / "x")])
    assert long_name.exit_code == 2 and "at most 100 characters" in long_name.output
    assert "Traceback" not in long_name.output and long_name.output.splitlines()[-1].startswith("Error: Invalid value")
    long_folder = CliRunner().invoke(main, ["new-plugin", "foo", str(tmp_path / "sub" / ("d" * 300))])
    assert long_folder.exit_code == 1
    assert long_folder.output.startswith("Error: cannot write the plugin into ") and long_folder.output.count("\n") == 1
    assert "File name too long" in long_folder.output
    assert list(tmp_path.iterdir()) == []  # nothing half-written is left behind
