"""What users install: every package typed and checked, and a wheel that holds every file and works on its own.

CI installs prunereg in editable mode, where a module or data file that the
wheel leaves out still imports from the checkout; only building the wheel and
running it from elsewhere shows what a user would get.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mypy, a dev dependency, brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
_NOT_SHIPPED = ("__pycache__", "*.pyc", "*.pyo")


def top_level_packages() -> dict[str, Path]:
    """The top-level packages setuptools finds (``[tool.setuptools.packages.find]``), by import name."""
    found = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    names = [name for name in found["include"] if "*" not in name and "." not in name]
    packages = {
        name: ROOT / where / name for where in found["where"] for name in names if (ROOT / where / name).is_dir()
    }
    assert sorted(packages) == sorted(names), f"packages.find names packages that do not exist: {names}"
    return packages


def shipped_files(name: str, folder: Path) -> list[str]:
    """Every file of a package's source folder, as its path inside the wheel."""
    ignored = shutil.ignore_patterns(*_NOT_SHIPPED)
    files = []
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if path.is_file() and not any(ignored(str(path.parent), [part]) for part in parts):
            files.append("/".join((name, *parts)))
    return files


@pytest.mark.parametrize("name", sorted(top_level_packages()))
def test_every_package_is_typed_checked_and_layered(name: str) -> None:
    folder = top_level_packages()[name]
    tool = PYPROJECT["tool"]
    assert (folder / "py.typed").is_file(), f"{name} has no py.typed: type checkers would ignore its hints"
    assert "py.typed" in tool["setuptools"]["package-data"].get(name, []), f"{name}'s py.typed is not package data"
    assert str(folder.relative_to(ROOT)) in tool["mypy"]["files"], f"mypy does not check {name}"
    assert name in tool["ruff"]["lint"]["isort"]["known-first-party"], f"isort does not know {name} is ours"
    assert name in tool["importlinter"]["root_packages"], f"lint-imports does not check {name}"


def _copy_sources(target: Path) -> Path:
    """What the wheel is built from, copied, so that the build writes nothing into the checkout."""
    target.mkdir()
    ignored = shutil.ignore_patterns(*_NOT_SHIPPED, "*.egg-info", "build", "dist")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, target / name)
    for folder in top_level_packages().values():
        shutil.copytree(folder, target / folder.relative_to(ROOT), ignore=ignored)
    return target


def _build_wheel(tmp_path: Path) -> Path:
    source = _copy_sources(tmp_path / "source")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(source)]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    [wheel] = (tmp_path / "dist").glob("prunereg-*.whl")
    return wheel


def _fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    """A new venv with only the wheel installed; the test's own dependencies (torch...) visible at the end of its path.

    A path line in a ``.pth`` file puts this interpreter's site-packages on the
    venv's path without running the ``.pth`` files in it, so the editable
    install of the checkout stays invisible and ``import prunereg`` finds the wheel.
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, text=True, timeout=300)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(site) / "test-dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    return venv


# Runs in the fresh venv, from outside the checkout: one pruning of every kind, checked against torch.
PRUNE_EVERY_KIND = """
import copy, json, sys

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import prunereg, prunereg_builtins, prunereg_llm

torch.manual_seed(0)
layer = nn.Linear(16, 8)
same = {}
for name, arguments in [("l1_unstructured", {"amount": 0.5}), ("ln_structured", {"amount": 0.5, "n": 2, "dim": 0}),
                        ("custom_from_mask", {"mask": (torch.rand(8, 16) > 0.5).float()})]:
    ours, theirs = copy.deepcopy(layer), copy.deepcopy(layer)
    prunereg.get(name).apply(ours, "weight", **arguments)
    getattr(torch_prune, name)(theirs, "weight", **arguments)
    same[name + " (" + prunereg.info(name).kind + ")"] = torch.equal(ours.weight_mask, theirs.weight_mask)
stacks = [nn.Sequential(nn.Linear(16, 8), nn.Linear(8, 4)) for _ in range(2)]
stacks[1].load_state_dict(stacks[0].state_dict())
prunereg.global_unstructured([(m, "weight") for m in stacks[0]], prunereg.get("l1_unstructured"), amount=0.5)
torch_prune.global_unstructured([(m, "weight") for m in stacks[1]], torch_prune.L1Unstructured, amount=0.5)
same["global_unstructured"] = all(torch.equal(a.weight_mask, b.weight_mask) for a, b in zip(*stacks))

config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config).eval()
report = prunereg.oneshot(model, "wanda", calibration=torch.randint(0, 64, (4, 16)), sparsity=0.5, progress=False)
mlp = model.model.layers[1].mlp.up_proj.weight
print(json.dumps({
    "files": [module.__file__ for module in (prunereg, prunereg_builtins, prunereg_llm)],
    "same_masks_as_torch": same,
    "calibrated": [prunereg.info("wanda").kind, report.overall_sparsity, (mlp == 0).float().mean(dim=1).tolist()],
}))
"""


@pytest.mark.slow
def test_the_wheel_holds_every_file_and_prunes_every_kind_outside_the_checkout(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        inside = set(archive.namelist())
        entry_points = archive.read("prunereg-0.1.0.dist-info/entry_points.txt").decode()
    expected = [file for name, folder in top_level_packages().items() for file in shipped_files(name, folder)]
    assert [file for file in expected if file not in inside] == []
    assert "prunereg = prunereg._cli:main" in entry_points
    for plugin, module in PYPROJECT["project"]["entry-points"]["prunereg"].items():
        assert f"{plugin} = {module}" in entry_points

    venv = _fresh_venv(tmp_path, wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}

    def run(*command: str) -> str:
        done = subprocess.run(command, cwd=elsewhere, env=environment, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = json.loads(run(str(venv / "bin" / "prunereg"), "list", "--json"))
    assert {row["package"] for row in listed} == {"prunereg"}
    assert {row["name"] for row in listed} >= {"l1_unstructured", "ln_structured", "custom_from_mask", "wanda"}

    (elsewhere / "prune_every_kind.py").write_text(PRUNE_EVERY_KIND)
    result = json.loads(run(str(venv / "bin" / "python"), "prune_every_kind.py").splitlines()[-1])
    assert all(Path(file).is_relative_to(venv) for file in result["files"]), result["files"]
    assert result["same_masks_as_torch"] == {
        "l1_unstructured (unstructured)": True,
        "ln_structured (structured)": True,
        "custom_from_mask (global)": True,
        "global_unstructured": True,
    }
    kind, overall, row_sparsities = result["calibrated"]
    assert kind == "calibrated" and overall == pytest.approx(0.5) and set(row_sparsities) == {0.5}

    run(str(venv / "bin" / "prunereg"), "new-plugin", "demo", "prunereg-demo")  # the templates are package data
    assert (elsewhere / "prunereg-demo" / "prunereg_demo" / "method.py").is_file()
