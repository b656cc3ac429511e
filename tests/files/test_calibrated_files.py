"""Calibrated methods on model files: those needing no calibration prune them, the others point to oneshot.

Issue 22, item 6: ``prunereg prune --method magnitude --arg pattern=2:4`` crashed with
``'Magnitude' object has no attribute 'compute_mask'``, and ``prune``'s "known:" list
offered methods it cannot run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from safetensors.torch import save_file

import prunereg
from prunereg._cli import main
from prunereg._files import checkpoint as _checkpoint


def _invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="prunereg")


def _weights(dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A linear weight, a conv weight (pruned as the matrix [out, in*kh*kw]), a bias and an embedding."""
    generator = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(10, 8, generator=generator).to(dtype),
        "fc.weight": torch.randn(6, 16, generator=generator).to(dtype),
        "fc.bias": torch.randn(6, generator=generator).to(dtype),
        "conv.weight": torch.randn(4, 2, 2, 2, generator=generator).to(dtype),
    }


def _lowest_per_row(matrix: torch.Tensor, count: int) -> torch.Tensor:
    """Reference in float64: True at the ``count`` smallest |entries| of every row (no ties in these weights)."""
    order = matrix.double().abs().argsort(dim=1)[:, :count]
    return torch.zeros_like(matrix, dtype=torch.bool).scatter_(1, order, True)


def _lowest_n_of_m(matrix: torch.Tensor, n: int, m: int) -> torch.Tensor:
    rows, columns = matrix.shape
    groups = matrix.double().abs().reshape(rows, columns // m, m)
    pruned = torch.zeros(groups.shape, dtype=torch.bool).scatter_(-1, groups.argsort(dim=-1)[..., :n], True)
    return pruned.reshape(rows, columns)


def _lowest_overall(matrix: torch.Tensor, count: int) -> torch.Tensor:
    flat = matrix.double().abs().reshape(-1)
    return torch.zeros_like(flat, dtype=torch.bool).scatter_(0, flat.argsort()[:count], True).reshape(matrix.shape)


@pytest.mark.parametrize(
    ("args", "reference"),
    [
        (["--arg", "sparsity=0.5", "--arg", "pattern=2:4"], lambda w: _lowest_n_of_m(w, 2, 4)),
        (["--arg", "sparsity=0.25"], lambda w: _lowest_per_row(w, round(0.25 * w.shape[1]))),
        (["--arg", "sparsity=0.4", "--arg", "scope=matrix"], lambda w: _lowest_overall(w, round(0.4 * w.numel()))),
    ],
    ids=["2:4", "row", "matrix"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_magnitude_prunes_a_file_as_the_float64_reference(
    tmp_path: Path, args: list[str], reference, dtype: torch.dtype
) -> None:
    source, output = tmp_path / "model.safetensors", tmp_path / "out.safetensors"
    original = _weights(dtype)
    save_file(original, source)
    result = _invoke("prune", source, output, "--method", "magnitude", *args)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("pruned 2 of 4 tensors with magnitude: ")
    pruned = _checkpoint.read(output).tensors
    for name in ("fc.weight", "conv.weight"):
        weight = original[name]
        expected = weight.masked_fill(reference(weight.reshape(weight.shape[0], -1)).reshape(weight.shape), 0)
        assert pruned[name].dtype == dtype and torch.equal(pruned[name], expected), name
    for name in ("embed.weight", "fc.bias"):
        assert torch.equal(pruned[name], original[name])


def test_magnitude_through_prune_file_writes_the_same_as_the_command(tmp_path: Path) -> None:
    source = tmp_path / "model.pt"
    torch.save(_weights(), source)
    _invoke("prune", source, tmp_path / "cli.pt", "--method", "magnitude", "--arg", "pattern=2:4")
    report = prunereg.prune_file(
        source, tmp_path / "lib.pt", "magnitude", arguments={"pattern": "2:4"}, masks=tmp_path / "m.safetensors"
    )
    assert report.sparsity == 0.5
    cli, library = (_checkpoint.read(tmp_path / name).tensors for name in ("cli.pt", "lib.pt"))
    assert all(torch.equal(cli[name], library[name]) for name in cli)
    masks = _checkpoint.read(tmp_path / "m.safetensors").tensors
    assert sorted(masks) == ["conv.weight", "fc.weight"]
    assert torch.equal(masks["fc.weight"], library["fc.weight"] != 0)


def test_a_pruned_pair_keeps_its_mask_and_its_zeros_count(tmp_path: Path) -> None:
    """Re-pruning ``weight_orig``/``weight_mask``: the old zeros stay, and count toward the new sparsity."""
    weight = _weights()["fc.weight"]
    old_mask = torch.ones_like(weight)
    old_mask[:, :2] = 0  # 2 of 16 per row pruned before, whatever their size
    source, output = tmp_path / "pruned.pt", tmp_path / "again.pt"
    torch.save({"fc.weight_orig": weight, "fc.weight_mask": old_mask, "fc.bias": torch.zeros(6)}, source)
    result = _invoke("prune", source, output, "--method", "magnitude", "--arg", "sparsity=0.5")
    assert result.exit_code == 0, result.stderr
    written = _checkpoint.read(output).tensors
    assert torch.equal(written["fc.weight_orig"], weight)
    expected = ~_lowest_per_row(weight * old_mask, 8)
    assert torch.equal(written["fc.weight_mask"], expected.float())
    assert not written["fc.weight_mask"][:, :2].any()


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_a_method_that_needs_calibration_points_to_oneshot_in_one_line(tmp_path: Path, method: str) -> None:
    source = tmp_path / "model.safetensors"
    save_file(_weights(), source)
    result = _invoke("prune", source, tmp_path / "out.safetensors", "--method", method)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"Error: method {method!r} needs calibration")
    assert "run it on a model folder with prunereg oneshot" in result.stderr
    assert os.listdir(tmp_path) == ["model.safetensors"]
    with pytest.raises(ValueError, match="needs calibration data"):
        prunereg.prune_file(source, tmp_path / "out.safetensors", method)


def test_prunes_known_list_names_only_the_methods_it_can_run(tmp_path: Path) -> None:
    source = tmp_path / "model.safetensors"
    save_file(_weights(), source)
    result = _invoke("prune", source, tmp_path / "out.safetensors", "--method", "magnitud")
    assert result.exit_code == 1
    known = result.stderr.partition("(known: ")[2].rstrip(")\n").split(", ")
    assert "magnitude" in known and "l1_unstructured" in known and "ln_structured" in known
    assert "wanda" not in known and "sparsegpt" not in known
    assert "did you mean 'magnitude'" in result.stderr


def test_global_pruning_refuses_a_calibrated_method(tmp_path: Path) -> None:
    source = tmp_path / "model.safetensors"
    save_file(_weights(), source)
    result = _invoke("prune", source, tmp_path / "out.safetensors", "--method", "magnitude", "--global")
    assert result.exit_code == 1
    assert result.stderr == "Error: global pruning needs an unstructured method; 'magnitude' is calibrated\n"


def test_list_and_info_say_which_command_runs_each_method() -> None:
    rows = {row["name"]: row for row in json.loads(_invoke("list", "--json").stdout)}
    assert rows["l1_unstructured"]["runs_with"] == "prune, prune --global"
    assert rows["ln_structured"]["runs_with"] == "prune"
    assert rows["wanda"]["runs_with"] == "oneshot; prune if calibration-free"
    assert "RUNS WITH" in _invoke("list").stdout.splitlines()[0]
    for name, expected in [
        ("magnitude", ["oneshot", "prune"]),
        ("wanda", ["oneshot"]),
        ("sparsegpt", ["oneshot"]),
        ("l1_unstructured", ["prune", "prune --global"]),
    ]:
        assert json.loads(_invoke("info", name, "--json").stdout)["runs_with"] == expected, name
    assert "runs with: prunereg oneshot, prunereg prune" in _invoke("info", "magnitude").stdout.splitlines()
