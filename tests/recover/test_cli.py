"""The recovery kind on the command line: `prunereg list --kind recovery`, `info`, `new-plugin --kind recovery`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from prunereg._cli import main
from tests.support.generated_plugin import install_and_test

BUILT_INS = {"refit", "replace", "blockwise", "distill"}


def test_list_shows_the_built_in_recovery_methods_and_how_they_run() -> None:
    result = CliRunner().invoke(main, ["list", "--kind", "recovery", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {row["name"] for row in rows} == BUILT_INS
    assert {row["kind"] for row in rows} == {"recovery"}
    assert {row["runs_with"] for row in rows} == {"prunereg.recover; shrink --recover (block by block)"}


def test_info_says_which_recovery_methods_run_in_prunereg_shrink() -> None:
    result = CliRunner().invoke(main, ["info", "refit"])
    assert result.exit_code == 0, result.output
    assert "runs with: prunereg shrink --recover" in result.output
    assert "ridge: float = 0.0001" in result.output
    details = json.loads(CliRunner().invoke(main, ["info", "blockwise", "--json"]).stdout)
    assert details["runs_with"] == ["shrink --recover"] and details["kind"] == "recovery"
    details = json.loads(CliRunner().invoke(main, ["info", "distill", "--json"]).stdout)
    assert details["runs_with"] == []


def test_the_recovery_template_writes_a_recovery_method_with_the_packaging(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["new-plugin", "demo", str(tmp_path / "demo"), "--kind", "recovery"])
    assert result.exit_code == 0, result.output
    method = (tmp_path / "demo" / "prunereg_demo" / "method.py").read_text()
    assert "class DemoPruning(prunereg.RecoveryMethod):" in method
    assert 'kind="recovery"' in (tmp_path / "demo" / "prunereg_demo" / "__init__.py").read_text()
    assert 'demo = "prunereg_demo"' in (tmp_path / "demo" / "pyproject.toml").read_text()
    assert "check_recovery_method" in (tmp_path / "demo" / "tests" / "test_demo.py").read_text()


@pytest.mark.slow
def test_a_generated_recovery_plugin_installs_registers_and_passes_its_own_tests(tmp_path: Path) -> None:
    rows, tests = install_and_test(tmp_path, "demo-recovery", "recovery")
    assert rows["demo_recovery"]["package"] == "prunereg-demo-recovery"
    assert rows["demo_recovery"]["target"] == "prunereg_demo_recovery.method:DemoRecoveryPruning"
    assert "3 passed" in tests


@pytest.fixture
def llama_folder(tmp_path: Path) -> Path:
    pytest.importorskip("transformers")
    from tests.support.tiny_lm import random_text, save_tiny_llama_folder

    save_tiny_llama_folder(tmp_path / "dense")
    (tmp_path / "calibration.txt").write_text(random_text(200, seed=1))
    return tmp_path


def _shrink_args(folder: Path, *extra: str) -> list[str]:
    return [
        "shrink", str(folder / "dense"), str(folder / "small"), "-m", "flap", "--mlp", "0.5", "--calibration",
        str(folder / "calibration.txt"), "--samples", "4", "--seq-len", "32", *extra,
    ]  # fmt: skip


def test_shrink_recover_refits_in_the_same_pass_and_stock_reloads_it(llama_folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    result = CliRunner().invoke(main, _shrink_args(llama_folder, "--recover", "refit", "--json"))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    steps = report["recovery"]["steps"]
    assert report["recovery"]["method"] == "refit" and len(steps) == 2
    assert all(step["loss_after"] < step["loss_before"] for step in steps)
    plain = _shrink_args(llama_folder)
    plain[2] = str(llama_folder / "plain")
    assert CliRunner().invoke(main, plain).exit_code == 0
    small = AutoModelForCausalLM.from_pretrained(llama_folder / "small").state_dict()
    unrecovered = AutoModelForCausalLM.from_pretrained(llama_folder / "plain").state_dict()
    assert small.keys() == unrecovered.keys()
    changed = {name for name, tensor in small.items() if not torch.equal(tensor, unrecovered[name])}
    assert changed == {f"model.layers.{i}.mlp.down_proj.{part}" for i in range(2) for part in ("weight", "bias")}


def test_recover_options_configure_the_recovery_method_and_are_checked_before_loading(llama_folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    result = CliRunner().invoke(main, _shrink_args(llama_folder, "--recover", "refit", "--recover-option", "ridge=0.5"))
    assert result.exit_code == 0, result.output
    assert "recovered with Refit(ridge=0.5" in result.stdout
    default = _shrink_args(llama_folder, "--recover", "refit")
    default[2] = str(llama_folder / "default")
    assert CliRunner().invoke(main, default).exit_code == 0
    down = "model.layers.0.mlp.down_proj.weight"
    ridged = AutoModelForCausalLM.from_pretrained(llama_folder / "small").state_dict()[down]
    assert not torch.allclose(ridged, AutoModelForCausalLM.from_pretrained(llama_folder / "default").state_dict()[down])
    for extra, message in [
        (["--recover-option", "ridge=0.5"], "--recover-option configures the --recover method; give --recover"),
        (["--recover", "refit", "--recover-option", "epochs=2"], "--recover-option: method 'refit'"),
        (["--recover", "blockwise", "--recover-option", "epochs=0"], "--recover-option: epochs must be an int >= 1"),
        (
            ["--recover", "blockwise", "--recover-option", "dense_inputs=yes"],
            "--recover-option: dense_inputs must be True or False, not 'yes'",
        ),
    ]:
        arguments = _shrink_args(llama_folder, *extra)
        arguments[2] = str(llama_folder / "refused")
        refused = CliRunner().invoke(main, arguments)
        assert refused.exit_code == 2 and message in refused.output, refused.output
        assert not (llama_folder / "refused").exists()


def test_blockwise_trains_on_the_dense_inputs_when_the_command_line_says_so(llama_folder: Path) -> None:
    result = CliRunner().invoke(
        main, _shrink_args(llama_folder, "--recover", "blockwise", "--recover-option", "dense_inputs=True", "--json")
    )
    assert result.exit_code == 0, result.output
    steps = json.loads(result.stdout)["recovery"]["steps"]
    assert steps and all("alternate batches on the dense inputs" in step["note"] for step in steps)


@pytest.mark.slow
def test_shrink_steps_runs_as_a_real_subprocess(llama_folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    from tests.support.processes import run_prunereg

    completed = run_prunereg(_shrink_args(llama_folder, "--recover", "refit", "--steps", "2"))
    assert completed.returncode == 0, completed.stderr
    assert "in 2 rounds" in completed.stdout and "recovered with refit" in completed.stdout
    assert AutoModelForCausalLM.from_pretrained(llama_folder / "small").config.intermediate_size == 24
