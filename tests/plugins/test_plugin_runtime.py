"""Installed plugins misbehaving while they run and around the output, in real processes (issue 20, items 11, 12).

Before: ``sys.exit(0)`` in ``compute_mask`` ended ``prunereg prune`` with status 0
and nothing written; a plugin's own ``KeyboardInterrupt`` printed "Aborted!";
``print(file=sys.__stdout__)``, an ``atexit`` print, a write to descriptor 1 or a
print while pruning corrupted ``--json``; a plugin rewrapping ``sys.stdout`` at
import closed prunereg's stderr, so its error message never appeared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.plugin_fakes import fake_install, site_env

pytestmark = pytest.mark.slow  # fresh interpreters importing torch

HOOK = "import prunereg\n\n@prunereg.hookimpl\ndef prunereg_register_methods(register):\n"

METHODS = """
import os
import sys

import torch
import prunereg


class ExitsInMask(prunereg.BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t, default_mask):
        sys.exit(0)


class InterruptsInMask(prunereg.BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t, default_mask):
        raise KeyboardInterrupt


class PrintsInMask(prunereg.BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t, default_mask):
        print("printed while pruning")
        print("printed to sys.__stdout__ while pruning", file=sys.__stdout__, flush=True)
        os.write(1, b"written to descriptor 1 while pruning\\n")
        return default_mask * (t.abs() > t.abs().median()).to(default_mask.dtype)


class PrintsInGroup(prunereg.CalibratedMethod):
    def prune_group(self, weights, statistics, sparsities):
        print("printed by prune_group")
        print("printed to sys.__stdout__ by prune_group", file=sys.__stdout__, flush=True)
        return [
            prunereg.PrunedWeight(w * (w.abs() > w.abs().median()), w.abs() > w.abs().median()) for w in weights
        ]


class ExitsInGroup(prunereg.CalibratedMethod):
    def prune_group(self, weights, statistics, sparsities):
        sys.exit(0)
"""

PLUGINS = {
    "prunereg_runtime": HOOK
    + "".join(
        f"    register({name!r}, 'prunereg_runtime_methods:{cls}', kind={kind!r}, summary='A misbehaving method')\n"
        for name, cls, kind in [
            ("exits_in_mask", "ExitsInMask", "unstructured"),
            ("interrupts_in_mask", "InterruptsInMask", "unstructured"),
            ("prints_in_mask", "PrintsInMask", "unstructured"),
            ("prints_in_group", "PrintsInGroup", "calibrated"),
            ("exits_in_group", "ExitsInGroup", "calibrated"),
        ]
    ),
    "prunereg_noisy": (
        "import atexit, os, sys\n"
        "print('printed to sys.__stdout__ at import', file=sys.__stdout__, flush=True)\n"
        "os.write(1, b'written to descriptor 1 at import\\n')\n"
        "atexit.register(print, 'printed at exit')\n" + HOOK + "    pass\n"
    ),
    "prunereg_rewraps": "import io, sys\nsys.stdout = io.TextIOWrapper(sys.stdout.buffer, encoding='utf-8')\n"
    + HOOK
    + "    pass\n",
}
NOISE = ["printed to sys.__stdout__ at import", "written to descriptor 1 at import", "printed at exit"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    for module, source in PLUGINS.items():
        fake_install(folder, module, source)
    (folder / "prunereg_runtime_methods.py").write_text(METHODS)
    return folder


def prunereg_cli(site: Path, *args: object) -> subprocess.CompletedProcess[str]:
    executable = Path(sys.executable).with_name("prunereg")
    env = {**os.environ, **site_env(site), "PRUNEREG_STRICT_PLUGINS": "0"}
    return subprocess.run([str(executable), *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


def _model(folder: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    path = folder / "model.safetensors"
    save_file({"layer.weight": torch.arange(1.0, 17.0).reshape(4, 4)}, str(path))
    return path


def test_list_json_stays_json_whatever_plugins_print_around_it(site: Path) -> None:
    result = prunereg_cli(site, "list", "--json")
    assert result.returncode == 0, result.stderr
    assert {"exits_in_mask", "prints_in_group"} <= {row["name"] for row in json.loads(result.stdout)}
    for noise in NOISE:
        assert noise in result.stderr, noise


def test_a_method_exiting_while_it_prunes_is_an_error_and_writes_nothing(site: Path, tmp_path: Path) -> None:
    source = _model(tmp_path)
    result = prunereg_cli(site, "prune", source, tmp_path / "out.safetensors", "--method", "exits_in_mask")
    assert result.returncode == 1 and result.stdout == ""
    [error] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert "cannot prune 'layer.weight'" in error and "ExitsInMask.compute_mask called sys.exit(0)" in error
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]


def test_a_methods_own_keyboard_interrupt_is_an_error_not_an_abort(site: Path, tmp_path: Path) -> None:
    source = _model(tmp_path)
    result = prunereg_cli(site, "prune", source, tmp_path / "out.safetensors", "--method", "interrupts_in_mask")
    assert result.returncode == 1 and result.stdout == ""
    assert "Aborted!" not in result.stderr
    [error] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert "raised KeyboardInterrupt itself (no Ctrl-C was pressed)" in error


def test_what_a_method_prints_while_pruning_never_reaches_stdout(site: Path, tmp_path: Path) -> None:
    source, output = _model(tmp_path), tmp_path / "out.safetensors"
    result = prunereg_cli(site, "prune", source, output, "--method", "prints_in_mask")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"pruned 1 of 1 tensors with prints_in_mask: 8 of 16 entries are zero (50.0%); wrote {output}\n"
        "  selected 1: layer.weight\n"
    )
    for printed in ("printed while pruning", "printed to sys.__stdout__ while", "written to descriptor 1 while"):
        assert printed in result.stderr


def test_prunereg_s_errors_survive_a_plugin_that_rewraps_stdout(site: Path, tmp_path: Path) -> None:
    result = prunereg_cli(site, "prune", _model(tmp_path), tmp_path / "out.safetensors", "--method", "no_such")
    assert result.returncode == 1 and result.stdout == ""
    assert "Error: no pruning method named 'no_such'" in result.stderr


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from tests.support.tiny_lm import random_text, save_tiny_llama_folder

    folder = tmp_path_factory.mktemp("lm")
    save_tiny_llama_folder(folder / "model")
    (folder / "calibration.txt").write_text(random_text(200, seed=1))
    return folder


def _oneshot(site: Path, folder: Path, output: Path, method: str) -> subprocess.CompletedProcess[str]:
    return prunereg_cli(
        site, "oneshot", folder / "model", output, "--method", method,
        "--calibration", folder / "calibration.txt", "--samples", "2", "--seq-len", "16", "--json",
    )  # fmt: skip


def test_oneshot_json_stays_json_whatever_prune_group_prints(site: Path, lm_folder: Path, tmp_path: Path) -> None:
    result = _oneshot(site, lm_folder, tmp_path / "out", "prints_in_group")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["method"] == "prints_in_group"
    assert "printed by prune_group" in result.stderr and "printed to sys.__stdout__ by prune_group" in result.stderr


def test_oneshot_with_a_method_exiting_in_prune_group_fails_and_writes_nothing(
    site: Path, lm_folder: Path, tmp_path: Path
) -> None:
    result = _oneshot(site, lm_folder, tmp_path / "out", "exits_in_group")
    assert result.returncode == 1 and result.stdout == ""
    assert "ExitsInGroup.prune_group called sys.exit(0)" in result.stderr
    assert not (tmp_path / "out").exists()
