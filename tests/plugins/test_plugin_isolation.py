"""Misbehaving installed plugins, in a real process: nothing a plugin does ends, silences or corrupts a command.

Each plugin below is installed (a real dist-info with an entry point) into one
folder put on ``PYTHONPATH``; every case was a broken promise before (issue 13,
items 2, 6, 7, 8 and 9).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.plugin_fakes import fake_install, site_env

pytestmark = pytest.mark.slow  # about 15 fresh interpreters importing torch; the fast twins are in test_plugins.py

HOOK = "import prunereg\n\n@prunereg.hookimpl\ndef prunereg_register_methods(register):\n"

PLUGINS = {
    "prunereg_exits_at_import": "import sys\nprint('printed at import')\nsys.exit(3)\n",
    "prunereg_exits_in_hook": HOOK + "    print('printed in the hook')\n    raise SystemExit(0)\n",
    "prunereg_interrupts": HOOK + "    raise KeyboardInterrupt\n",
    "prunereg_late_exit": HOOK
    + "    register('late_exit', 'prunereg_late_exit_impl:Gone', kind='unstructured', summary='Exits')\n",
    "prunereg_registers_at_import": (
        "import prunereg\n"
        "from prunereg_fake_methods import Median\n\n"
        "prunereg.register('registered_at_import', summary='Registered with prunereg.register at import')(Median)\n"
    ),
    "prunereg_asks_for_methods": HOOK
    + (
        "    known = prunereg.list_methods()\n"
        "    register('asked', 'prunereg_fake_methods:Median', kind='unstructured',\n"
        "             summary=f'Saw {len(known)} methods')\n"
    ),
    "prunereg_unresolvable": HOOK
    + (
        "    register('unresolvable', 'prunereg_fake_methods:Unresolvable', kind='unstructured',\n"
        "             summary='Odd annotations')\n"
        "    register('unreadable', 'prunereg_fake_methods:Unreadable', kind='unstructured', summary='No signature')\n"
        "    register('shout', 'prunereg_fake_methods:Median', kind='unstructured',\n"
        "             summary='\\x1b[31mRED\\x1b[0m \\x1b]0;title\\x07 bell\\x07 done')\n"
    ),
}

FAKE_PLUGINS = {module.removeprefix("prunereg_") for module in PLUGINS}

METHODS = '''
from __future__ import annotations

import torch
import prunereg


class Median(prunereg.BasePruningMethod):
    """Prune the entries below the median magnitude."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t, default_mask):
        return default_mask * (t.abs() >= t.abs().median()).to(default_mask.dtype)


class Unresolvable(Median):
    def __init__(self, amount: torch.NoSuchType = 0.5) -> None:
        self.amount = amount


class _NoSignature(type(prunereg.BasePruningMethod)):
    @property
    def __signature__(cls):
        raise RuntimeError("no signature here")


class Unreadable(Median, metaclass=_NoSignature):
    """Its constructor's signature cannot be read."""
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    for module, source in PLUGINS.items():
        fake_install(folder, module, source)
    (folder / "prunereg_late_exit_impl.py").write_text(
        "import sys\nprint('printed by the method module')\nsys.exit(0)\n"
    )
    (folder / "prunereg_fake_methods.py").write_text(METHODS)
    return folder


def prunereg_cli(
    site: Path, *args: str, strict: bool = False, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    executable = Path(sys.executable).with_name("prunereg")
    env = {**os.environ, **site_env(site), "PRUNEREG_STRICT_PLUGINS": "1" if strict else "0"}
    return subprocess.run([str(executable), *args], capture_output=True, text=True, env=env, cwd=cwd)


def test_list_json_stays_json_and_every_misbehaving_plugin_is_reported(site: Path) -> None:
    result = prunereg_cli(site, "list", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert {"l1_unstructured", "registered_at_import", "asked", "unresolvable", "late_exit"} <= set(rows)
    assert rows["registered_at_import"]["package"] == "prunereg-registers-at-import"
    assert rows["asked"]["summary"].startswith("Saw ")
    assert "printed at import" in result.stderr and "printed in the hook" in result.stderr
    assert (
        "plugin 'exits_at_import' (prunereg-exits-at-import 1.0): failed to load and was skipped: SystemExit: 3"
        in result.stderr
    )
    assert (
        "plugin 'exits_in_hook' (prunereg-exits-in-hook 1.0): failed to load and was skipped: SystemExit: 0"
        in result.stderr
    )
    assert (
        "plugin 'interrupts' (prunereg-interrupts 1.0): failed to load and was skipped: KeyboardInterrupt"
        in result.stderr
    )
    assert "RecursionError" not in result.stderr and "defines no prunereg_register_methods" not in result.stderr


def test_plugins_shows_each_plugin_failed_or_loaded_on_its_own(site: Path) -> None:
    result = prunereg_cli(site, "plugins", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    # Every plugin installed here, and every built-in one, loaded or failed on its own.
    statuses = {name: row["status"] for name, row in rows.items() if name in FAKE_PLUGINS or row["status"] != "loaded"}
    assert statuses == {
        "asks_for_methods": "loaded",
        "exits_at_import": "error",
        "exits_in_hook": "error",
        "interrupts": "error",
        "late_exit": "error",
        "registers_at_import": "loaded",
        "unresolvable": "loaded",
    }
    assert rows["registers_at_import"]["methods"] == ["registered_at_import"]
    assert "'late_exit' is unavailable" in rows["late_exit"]["error"] and "SystemExit: 0" in rows["late_exit"]["error"]
    assert "printed by the method module" in result.stderr


def test_prune_with_a_method_whose_module_exits_fails_in_one_line_and_writes_nothing(
    site: Path, tmp_path: Path
) -> None:
    source = model_file(tmp_path)
    result = prunereg_cli(site, "prune", str(source), str(tmp_path / "out.safetensors"), "--method", "late_exit")
    assert result.returncode == 1
    assert result.stdout == ""
    [error] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert "'late_exit' is unavailable" in error and "SystemExit: 0" in error
    assert not (tmp_path / "out.safetensors").exists()


def test_prune_and_info_read_a_signature_whose_annotations_cannot_be_resolved(site: Path, tmp_path: Path) -> None:
    source, output = model_file(tmp_path), tmp_path / "out.safetensors"
    pruned = prunereg_cli(site, "prune", str(source), str(output), "--method", "unresolvable", "--amount", "0.5")
    assert pruned.returncode == 0, pruned.stderr
    assert output.is_file() and "pruned 1 of 1 tensors with unresolvable" in pruned.stdout
    unknown = prunereg_cli(
        site, "prune", str(source), str(tmp_path / "x.safetensors"), "--method", "unresolvable", "--arg", "ratio=0.5"
    )
    assert unknown.returncode == 1 and "does not take argument 'ratio' (it takes: amount)" in unknown.stderr
    info = prunereg_cli(site, "info", "unresolvable")
    assert info.returncode == 0, info.stderr
    assert "parameters: amount: torch.NoSuchType = 0.5" in info.stdout.splitlines()


def test_info_on_a_method_whose_signature_cannot_be_read_still_answers(site: Path) -> None:
    result = prunereg_cli(site, "info", "unreadable")
    assert result.returncode == 0, result.stderr
    assert "parameters: unknown (the constructor's signature cannot be read)" in result.stdout.splitlines()
    assert "Traceback" not in result.stderr
    assert json.loads(prunereg_cli(site, "info", "unreadable", "--json").stdout)["parameters"] is None


def test_strict_info_exits_non_zero_when_a_plugin_failed(site: Path) -> None:
    result = prunereg_cli(site, "info", "l1_unstructured", strict=True)
    assert result.returncode == 1
    assert result.stdout.startswith("l1_unstructured (unstructured)")
    assert "PRUNEREG_STRICT_PLUGINS" in result.stderr


def test_escape_sequences_from_plugins_never_reach_the_terminal(site: Path) -> None:
    for args in (("list",), ("plugins",), ("info", "shout")):
        result = prunereg_cli(site, *args)
        assert result.returncode == 0, result.stderr
        assert "\x1b" not in result.stdout + result.stderr and "\x07" not in result.stdout + result.stderr
    listed = prunereg_cli(site, "list").stdout
    assert "RED  \\x07 done" in listed.replace("bell", "")


def test_python_sees_the_same_isolation(site: Path) -> None:
    code = (
        "import prunereg\n"
        "print(prunereg.get('registered_at_import').__name__)\n"
        "try:\n    prunereg.get('late_exit')\nexcept LookupError as error:\n    print('unavailable')\n"
        "print('still running')\n"
    )
    env = {**os.environ, **site_env(site), "PRUNEREG_STRICT_PLUGINS": "0"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Median\nunavailable\nstill running\n"


def test_a_plugin_module_the_user_imports_first_keeps_its_method(site: Path) -> None:
    code = (
        "import prunereg_registers_at_import, prunereg\n"
        "info = prunereg.info('registered_at_import')\n"
        "print(info.plugin, info.package)\n"
    )
    env = {**os.environ, **site_env(site), "PRUNEREG_STRICT_PLUGINS": "0", "PRUNEREG_PLUGINS": "registers_at_import"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "registers_at_import prunereg-registers-at-import\n"
    assert "PluginWarning" not in result.stderr


def model_file(folder: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    path = folder / "model.safetensors"
    save_file({"layer.weight": torch.arange(1.0, 17.0).reshape(4, 4)}, str(path))
    return path
