"""Model files: what is read, what is written back, and how unreadable files are reported."""

from __future__ import annotations

import pickle
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from prunereg._files import checkpoint as _checkpoint
from prunereg._files.checkpoint import CheckpointError


def _tensors() -> dict[str, torch.Tensor]:
    return {
        "layer.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "layer.bias": torch.tensor([1.5, -2.0], dtype=torch.float16),
        "steps": torch.tensor(7),
    }


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], *, ordered: bool = True) -> None:
    assert list(a) == list(b) if ordered else sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


def test_reads_safetensors_with_metadata(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file(_tensors(), path, metadata={"format": "pt", "note": "kept"})
    checkpoint = _checkpoint.read(path)
    assert checkpoint.format == "safetensors"
    assert checkpoint.metadata == {"format": "pt", "note": "kept"}
    assert set(checkpoint.tensors) == set(_tensors())
    for name, tensor in _tensors().items():
        assert torch.equal(checkpoint.tensors[name], tensor)


def test_safetensors_round_trip_keeps_metadata_and_replaces_only_given(tmp_path: Path) -> None:
    path, out = tmp_path / "m.safetensors", tmp_path / "o.safetensors"
    save_file(_tensors(), path, metadata={"note": "kept"})
    checkpoint = _checkpoint.read(path)
    _checkpoint.save(checkpoint, {"layer.weight": torch.zeros(2, 3)}, str(out))
    written = _checkpoint.read(out)
    assert written.metadata == {"note": "kept"}
    assert torch.equal(written.tensors["layer.weight"], torch.zeros(2, 3))
    _assert_same(
        {k: v for k, v in written.tensors.items() if k != "layer.weight"},
        {k: v for k, v in checkpoint.tensors.items() if k != "layer.weight"},
    )


def test_torch_state_dict_keeps_order_type_and_metadata(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    path, out = tmp_path / "m.pt", tmp_path / "o.pt"
    torch.save(model.state_dict(), path)
    checkpoint = _checkpoint.read(path)
    assert checkpoint.key is None
    _assert_same(checkpoint.tensors, dict(model.state_dict()))
    _checkpoint.save(checkpoint, {"0.weight": torch.ones(3, 2)}, str(out))
    loaded = torch.load(out, weights_only=True)
    assert isinstance(loaded, OrderedDict)
    assert list(loaded) == list(model.state_dict())
    assert loaded._metadata == model.state_dict()._metadata
    assert torch.equal(loaded["0.weight"], torch.ones(3, 2))
    model.load_state_dict(loaded)  # still a valid state dict for the model


@pytest.mark.parametrize("key", ["state_dict", "model"])
def test_checkpoint_dict_carries_everything_else_over(tmp_path: Path, key: str) -> None:
    path, out = tmp_path / "c.pth", tmp_path / "o.bin"
    content = {"epoch": 3, key: OrderedDict(_tensors()), "optimizer": {"lr": 0.1, "state": {0: torch.ones(2)}}}
    torch.save(content, path)
    checkpoint = _checkpoint.read(path)
    assert checkpoint.key == key
    _assert_same(checkpoint.tensors, _tensors())
    _checkpoint.save(checkpoint, {"layer.weight": torch.zeros(2, 3)}, str(out))
    loaded = torch.load(out, weights_only=True)
    assert list(loaded) == ["epoch", key, "optimizer"]
    assert loaded["epoch"] == 3 and loaded["optimizer"]["lr"] == 0.1
    assert torch.equal(loaded["optimizer"]["state"][0], torch.ones(2))
    assert list(loaded[key]) == list(_tensors())
    assert torch.equal(loaded[key]["layer.weight"], torch.zeros(2, 3))
    assert torch.equal(loaded[key]["layer.bias"], _tensors()["layer.bias"])


def test_non_tensor_entries_of_a_state_dict_are_kept_but_not_tensors(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    torch.save({"w": torch.ones(2, 2), "version": 2}, path)
    checkpoint = _checkpoint.read(path)
    assert list(checkpoint.tensors) == ["w"]
    assert checkpoint.with_tensors({"w": torch.zeros(2, 2)})["version"] == 2


DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int8,
    torch.bool,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shapes=st.lists(st.lists(st.integers(0, 4), max_size=3), min_size=1, max_size=4),
    dtype=st.sampled_from(DTYPES),
    suffix=st.sampled_from([".safetensors", ".pt"]),
)
def test_round_trip_keeps_names_shapes_dtypes_values(
    tmp_path: Path, shapes: list[list[int]], dtype: torch.dtype, suffix: str
) -> None:
    tensors = {f"t{i}": (torch.rand(shape) * 10).to(dtype) for i, shape in enumerate(shapes)}
    path, out = tmp_path / f"m{suffix}", tmp_path / f"o{suffix}"
    if suffix == ".pt":
        torch.save(tensors, path)
    else:
        save_file(tensors, path)
    checkpoint = _checkpoint.read(path)
    _checkpoint.save(checkpoint, {}, str(out))
    # safetensors orders a file itself (by dtype alignment, then name; empty tensors tie)
    _assert_same(_checkpoint.read(out).tensors, checkpoint.tensors, ordered=suffix == ".pt")
    assert {k: (v.shape, v.dtype) for k, v in checkpoint.tensors.items()} == {
        k: (v.shape, v.dtype) for k, v in tensors.items()
    }


@pytest.mark.parametrize("name", ["m.npz", "m", "m.ckpt.txt"])
def test_unknown_format(tmp_path: Path, name: str) -> None:
    with pytest.raises(CheckpointError, match="unknown format"):
        _checkpoint.read(tmp_path / name)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        _checkpoint.read(tmp_path / "nope.safetensors")
    (tmp_path / "dir.pt").mkdir()
    with pytest.raises(CheckpointError, match="is a directory"):
        _checkpoint.read(tmp_path / "dir.pt")


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
@pytest.mark.parametrize("keep", [0, 7, 0.5, -3])
def test_truncated_files(tmp_path: Path, suffix: str, keep: float) -> None:
    path = tmp_path / f"m{suffix}"
    if suffix == ".pt":
        torch.save(_tensors(), path)
    else:
        save_file(_tensors(), path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)] if isinstance(keep, float) else data[:keep])
    with pytest.raises(CheckpointError, match="cannot read"):
        _checkpoint.read(path)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_garbage(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"m{suffix}"
    path.write_bytes(b"this is not a model file at all")
    with pytest.raises(CheckpointError, match="cannot read"):
        _checkpoint.read(path)


class Payload:
    """A class that weights_only loading must refuse to construct."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pickle code ran",))


def test_weights_only_refuses_pickled_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2, 2), "payload": Payload()}, path)
    with pytest.raises(CheckpointError, match=r"weights_only=True\) refuses .*GLOBAL print"):
        _checkpoint.read(path)
    assert "pickle code ran" not in capsys.readouterr().out


def test_plain_pickle_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plain.pt"
    path.write_bytes(pickle.dumps({"w": [1, 2]}))
    with pytest.raises(CheckpointError, match=r"refuses to load, so its pickle was not run: Unsupported operand"):
        _checkpoint.read(path)


def test_a_file_that_is_no_dict(tmp_path: Path) -> None:
    path = tmp_path / "t.pt"
    torch.save([torch.ones(2)], path)
    with pytest.raises(CheckpointError, match="holds a list, not a state dict"):
        _checkpoint.read(path)


def test_save_safetensors_writes_bool_masks(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    masks = {"a": torch.tensor([[True, False]]), "b": torch.ones(3, 1, dtype=torch.bool)}
    _checkpoint.save_safetensors(masks, str(path), {"prunereg.method": "x"})
    loaded = load_file(path)
    assert loaded["a"].dtype == torch.bool
    _assert_same(loaded, masks, ordered=False)
