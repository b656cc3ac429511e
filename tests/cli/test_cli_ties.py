"""Tied tensors in a torch file (one tensor under several names) are pruned once and written back shared."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.utils.prune as torch_prune
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from prunereg._cli import main
from prunereg._files.shared_storage import first_names, tie, tied_names


def _invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="prunereg")


def _tied_model() -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """An encoder tied to its decoder (one tensor under two names), and a layer between them."""
    generator = torch.Generator().manual_seed(0)
    embedding, hidden = torch.randn(6, 4, generator=generator), torch.randn(4, 4, generator=generator)
    return embedding, hidden, {"encoder.weight": embedding, "hidden.weight": hidden, "decoder.weight": embedding}


def _loaded(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def test_a_tied_tensor_is_pruned_once_and_stays_tied(tmp_path: Path) -> None:
    embedding, hidden, state = _tied_model()
    path, output, masks = tmp_path / "m.pt", tmp_path / "out.pt", tmp_path / "masks.safetensors"
    torch.save(state, path)
    result = _invoke(
        "prune", path, output, "--method", "random_unstructured", "--amount", "0.5", "--seed", "3", "--masks", masks
    )
    assert result.exit_code == 0, result.stderr
    written = _loaded(output)
    assert written["encoder.weight"].data_ptr() == written["decoder.weight"].data_ptr()
    torch.manual_seed(3)  # torch draws for each distinct tensor once, in file order
    reference = torch_prune.RandomUnstructured(0.5)
    expected_embedding = reference.compute_mask(embedding, torch.ones_like(embedding)) * embedding
    expected_hidden = torch_prune.RandomUnstructured(0.5).compute_mask(hidden, torch.ones_like(hidden)) * hidden
    assert torch.equal(written["encoder.weight"], expected_embedding)
    assert torch.equal(written["hidden.weight"], expected_hidden)
    saved_masks = load_file(masks)
    assert sorted(saved_masks) == ["decoder.weight", "encoder.weight", "hidden.weight"]
    assert torch.equal(saved_masks["encoder.weight"], saved_masks["decoder.weight"])


def test_global_pruning_counts_a_tied_tensor_once(tmp_path: Path) -> None:
    embedding, hidden, state = _tied_model()
    path, output = tmp_path / "m.pt", tmp_path / "out.pt"
    torch.save(state, path)
    result = _invoke("prune", path, output, "--method", "l1_unstructured", "--amount", "0.5", "--global")
    assert result.exit_code == 0, result.stderr
    modules = [torch.nn.Linear(4, 6, bias=False), torch.nn.Linear(4, 4, bias=False)]
    with torch.no_grad():
        modules[0].weight.copy_(embedding)
        modules[1].weight.copy_(hidden)
    torch_prune.global_unstructured(
        [(modules[0], "weight"), (modules[1], "weight")], torch_prune.L1Unstructured, amount=0.5
    )
    written = _loaded(output)
    assert torch.equal(written["encoder.weight"], modules[0].weight)
    assert torch.equal(written["decoder.weight"], modules[0].weight)
    assert torch.equal(written["hidden.weight"], modules[1].weight)


def test_selecting_one_name_of_a_tied_tensor_prunes_the_tensor(tmp_path: Path) -> None:
    _, hidden, state = _tied_model()
    path, output = tmp_path / "m.pt", tmp_path / "out.pt"
    torch.save(state, path)
    result = _invoke("prune", path, output, "--method", "l1_unstructured", "--amount", "0.5", "--include", "decoder.*")
    assert result.exit_code == 0, result.stderr
    written = _loaded(output)
    assert written["encoder.weight"].data_ptr() == written["decoder.weight"].data_ptr()
    assert int((written["decoder.weight"] == 0).sum()) == 12
    assert torch.equal(written["hidden.weight"], hidden)


def test_overlapping_views_are_pruned_separately(tmp_path: Path) -> None:
    weight = torch.arange(1.0, 25.0).reshape(6, 4)
    path, output = tmp_path / "m.pt", tmp_path / "out.pt"
    torch.save({"fused.weight": weight, "part.weight": weight[:2]}, path)
    result = _invoke("prune", path, output, "--method", "l1_unstructured", "--amount", "0.5")
    assert result.exit_code == 0, result.stderr
    written = _loaded(output)
    assert int((written["fused.weight"] == 0).sum()) == 12
    assert torch.equal(written["part.weight"], torch.tensor([[0.0, 0, 0, 0], [5, 6, 7, 8]]))


def test_tied_names_are_identical_views_only() -> None:
    base = torch.arange(12.0).reshape(3, 4)
    tensors = {
        "a": base,
        "b": base,
        "t": base.t(),
        "row": base[0],
        "c": base.view(3, 4),
        "empty": torch.ones(0),
        "empty2": torch.ones(0),
        "copy": base.clone(),
    }
    tied = tied_names(tensors)
    assert tied == {"b": "a", "c": "a"}
    assert first_names(["c", "row", "b", "a"], tied) == ["a", "row"]
    results = {"a": torch.zeros(3, 4)}
    tie(results, tied)
    assert results["b"] is results["a"] and results["c"] is results["a"]
    copies = {"a": torch.zeros(3, 4)}
    tie(copies, tied, copies=True)
    assert copies["b"] is not copies["a"] and torch.equal(copies["b"], copies["a"])


def test_safetensors_files_hold_no_tied_tensors(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from prunereg._files import checkpoint

    path = tmp_path / "m.safetensors"
    save_file({"a": torch.ones(2, 2), "b": torch.ones(2, 2)}, path)
    assert tied_names(checkpoint.read(path).tensors) == {}


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.int8]),
    layout=st.lists(st.sampled_from(["same", "copy", "view", "transposed"]), min_size=1, max_size=5),
)
def test_only_the_same_view_is_tied(shape: list[int], dtype: torch.dtype, layout: list[str]) -> None:
    base = torch.ones(shape).to(dtype)
    make = {
        "same": lambda: base,
        "copy": base.clone,
        "view": lambda: base.view(shape),
        "transposed": lambda: base.transpose(0, -1),
    }
    tensors = {"base": base, **{f"t{i}": make[kind]() for i, kind in enumerate(layout)}}
    transposed = base.transpose(0, -1)  # the same view only where no dimension moves (sizes of 1)
    same_layout = transposed.shape == base.shape and transposed.stride() == base.stride()
    view_of = {"same": "base", "view": "base", "transposed": "base" if same_layout else "transposed"}
    first_of_view: dict[str, str] = {"base": "base"}
    expected = {}
    for i, kind in enumerate(layout):
        if kind == "copy":  # its own storage: tied to nothing
            continue
        first = first_of_view.setdefault(view_of[kind], f"t{i}")
        if first != f"t{i}":
            expected[f"t{i}"] = first
    assert tied_names(tensors) == expected
