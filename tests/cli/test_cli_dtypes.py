"""Tensors of dtypes that pruning cannot compute with (float8): left as they were, with a note, and reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from safetensors.torch import save_file

import prunereg
from prunereg._cli import main
from prunereg._files import checkpoint
from prunereg._files.dtypes import PRUNABLE_DTYPES, describe_unprunable, unprunable_floats

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz, torch.float8_e8m0fnu]


def _invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="prunereg")


def _write(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    torch.save(tensors, path) if path.suffix == ".pt" else save_file(tensors, path)
    return path


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_prune_leaves_float8_tensors_as_they_were_and_says_so(tmp_path: Path, dtype: torch.dtype, suffix: str) -> None:
    generator = torch.Generator().manual_seed(0)
    quantized = (torch.rand(4, 8, generator=generator) + 0.5).to(dtype)
    path = _write(
        tmp_path / f"model{suffix}",
        {"dense.weight": torch.rand(4, 8, generator=generator), "quantized.weight": quantized},
    )
    output = tmp_path / f"out{suffix}"
    result = _invoke("prune", path, output, "--method", "l1_unstructured", "--amount", "0.5")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("pruned 1 of 2 tensors with l1_unstructured: 16 of 32 entries are zero")
    name = str(dtype).removeprefix("torch.")
    assert result.stderr == (
        "note: left as they were: 1 floating-point tensor of a dtype that cannot be pruned: "
        f"'quantized.weight' ({name})\n"
    )
    written = checkpoint.read(output).tensors
    assert written["quantized.weight"].dtype == dtype
    assert torch.equal(written["quantized.weight"].view(torch.uint8), quantized.view(torch.uint8))
    assert int((written["dense.weight"] == 0).sum()) == 16


def test_a_file_of_float8_weights_only_says_why_nothing_was_selected(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "model.safetensors", {f"layer{i}.weight": torch.ones(2, 2).to(torch.float8_e4m3fn) for i in range(5)}
    )
    result = _invoke("prune", path, tmp_path / "out.safetensors", "--method", "l1_unstructured", "--amount", "0.5")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == (
        "Error: no tensor selected: of the 5 tensors, 5 of a dtype pruning cannot compute with "
        "(left alone: 5 floating-point tensors of a dtype that cannot be pruned: 'layer0.weight' (float8_e4m3fn), "
        "'layer1.weight' (float8_e4m3fn), 'layer2.weight' (float8_e4m3fn) and 2 more)\n"
    )
    assert sorted(path.parent.iterdir()) == [path]


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_report_shows_every_dtype_a_file_can_hold(tmp_path: Path, suffix: str) -> None:
    dtypes = [
        *FLOAT8,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.int8,
        torch.bool,
    ]
    tensors = {str(dtype).removeprefix("torch."): torch.tensor([[0, 1], [1, 1]]).to(dtype) for dtype in dtypes}
    path = _write(tmp_path / f"m{suffix}", tensors)
    result = _invoke("report", path, "--json")
    assert result.exit_code == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)["tensors"]}
    assert {name: row["dtype"] for name, row in rows.items()} == {name: name for name in tensors}
    expected_zeros = {name: int((tensor == 0).sum()) for name, tensor in tensors.items()}
    assert {name: row["zeros"] for name, row in rows.items()} == expected_zeros


def test_the_prunable_dtypes_are_those_the_builtins_compute_with() -> None:
    l1_unstructured = prunereg.get("l1_unstructured")
    for dtype in PRUNABLE_DTYPES:
        weight = torch.arange(1.0, 9.0).reshape(2, 4).to(dtype)
        assert int((l1_unstructured(0.5).compute_mask(weight, torch.ones_like(weight)) == 0).sum()) == 4
    for dtype in FLOAT8:
        weight = torch.arange(1.0, 9.0).reshape(2, 4).to(dtype)
        with pytest.raises((NotImplementedError, RuntimeError)):
            l1_unstructured(0.5).compute_mask(weight, torch.ones_like(weight))


def test_describe_unprunable_names_a_few() -> None:
    tensors = {"a": torch.ones(2, dtype=torch.float8_e5m2), "b": torch.ones(2), "c": torch.ones(2, dtype=torch.int8)}
    found = unprunable_floats(tensors)
    assert found == {"a": torch.float8_e5m2}
    assert describe_unprunable(found) == "1 floating-point tensor of a dtype that cannot be pruned: 'a' (float8_e5m2)"
