"""``prunereg report`` and ``prunereg prune`` on Hugging Face model folders and Lightning checkpoints.

Issue 22, item 9: both commands refused a folder (``oneshot``'s own output) and
``.ckpt`` files ("unknown format"); ``prunereg report OUTPUT_DIR`` is how a user
checks what ``oneshot`` wrote. Every input safety still holds: weights only,
regular files, nothing read outside the folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from click.testing import CliRunner, Result

import prunereg
from prunereg._cli import main
from prunereg._files import checkpoint as _checkpoint

transformers = pytest.importorskip("transformers")

from tests.support.fifos import fifo_unblocker  # noqa: E402
from tests.support.tiny_lm import calibration_ids, save_tiny_llama_folder, tiny_llama  # noqa: E402


def _invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="prunereg")


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    """A tiny Llama saved in five safetensors shards with an index, and its tokenizer."""
    folder = tmp_path / "model"
    save_tiny_llama_folder(folder)
    tiny_llama().save_pretrained(folder, max_shard_size="20KB")
    (folder / "model.safetensors").unlink()
    assert (folder / "model.safetensors.index.json").is_file() and len(list(folder.glob("model-*"))) > 2
    return folder


def _report(path: Path) -> dict:
    result = _invoke("report", path, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_report_reads_a_sharded_folder_as_the_model_it_holds(sharded: Path) -> None:
    report = _report(sharded)
    expected = tiny_llama().state_dict()
    rows = {row["name"]: row for row in report["tensors"]}
    assert set(rows) == set(expected)
    for name, tensor in expected.items():
        assert rows[name]["shape"] == list(tensor.shape) and rows[name]["zeros"] == int((tensor == 0).sum())
    assert report["total"]["numel"] == sum(t.numel() for t in expected.values())
    assert "model.layers.0.self_attn.q_proj.weight" in _invoke("report", sharded).stdout


def test_report_shows_what_oneshot_wrote(tmp_path: Path) -> None:
    source, output = tmp_path / "model", tmp_path / "pruned"
    save_tiny_llama_folder(source)
    prunereg.oneshot_folder(source, output, "magnitude", calibration=calibration_ids(), sparsity=0.5)
    rows = {row["name"]: row for row in _report(output)["tensors"]}
    for layer in range(2):
        for name in ("self_attn.q_proj", "mlp.down_proj"):
            assert rows[f"model.layers.{layer}.{name}.weight"]["sparsity"] == 0.5
    assert rows["model.embed_tokens.weight"]["sparsity"] == 0.0


@pytest.mark.parametrize("layout", ["sharded", "single", "pytorch_bin"])
def test_prune_writes_a_folder_that_loads_pruned_as_torch_prunes(tmp_path: Path, sharded: Path, layout: str) -> None:
    source = sharded
    if layout != "sharded":
        source = tmp_path / layout
        save_tiny_llama_folder(source)
        if layout == "pytorch_bin":
            (source / "model.safetensors").unlink()
            torch.save(tiny_llama().state_dict(), source / "pytorch_model.bin")
    before = _tree(source)
    output = tmp_path / "pruned"
    result = _invoke("prune", source, output, "--method", "l1_unstructured", "--amount", "0.3")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"pruned 14 of {len(tiny_llama().state_dict())} tensors with l1_unstructured")
    assert _tree(source) == before  # INPUT untouched
    written = _tree(output)
    assert set(written) == set(before)  # the same files: weights, index, config, tokenizer
    for name, data in before.items():
        if not name.endswith((".safetensors", ".bin")):
            assert written[name] == data, name  # copied as they were
    reference = tiny_llama()
    for module in reference.modules():
        if isinstance(module, torch.nn.Linear) and module is not reference.lm_head:
            torch_prune.l1_unstructured(module, "weight", amount=0.3)
            torch_prune.remove(module, "weight")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(output)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_prune_file_prunes_a_folder_with_its_masks(tmp_path: Path, sharded: Path) -> None:
    report = prunereg.prune_file(
        sharded, tmp_path / "out", "magnitude", arguments={"pattern": "2:4"}, masks=tmp_path / "m.safetensors"
    )
    assert report.sparsity == 0.5 and report.left_out == ()
    masks = _checkpoint.read(tmp_path / "m.safetensors").tensors
    assert len(masks) == 14 and all(mask.float().mean() == 0.5 for mask in masks.values())


def test_a_lightning_checkpoint_is_read_and_written_back_whole(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch")

    class Regressor(pl.LightningModule):
        def __init__(self, hidden: int = 8) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=0.01)

    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    trainer = pl.Trainer(
        max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Regressor(), data)
    source, output = tmp_path / "last.ckpt", tmp_path / "pruned.ckpt"
    trainer.save_checkpoint(source)
    assert [row["name"] for row in _report(source)["tensors"]] == [
        "net.0.weight",
        "net.0.bias",
        "net.2.weight",
        "net.2.bias",
    ]
    result = _invoke("prune", source, output, "--method", "l1_unstructured", "--amount", "0.5")
    assert result.exit_code == 0, result.stderr
    before, after = (torch.load(path, weights_only=True) for path in (source, output))
    assert list(after) == list(before) and after["hyper_parameters"] == before["hyper_parameters"]
    assert (
        after["epoch"] == before["epoch"]
        and after["optimizer_states"][0]["state"].keys() == before["optimizer_states"][0]["state"].keys()
    )
    restored = Regressor.load_from_checkpoint(output)
    assert int((restored.net[0].weight == 0).sum()) == 16 and int((restored.net[2].weight == 0).sum()) == 4


# Safety: nothing outside the folder is read, nothing of it is overwritten.


def test_a_link_leading_out_of_the_folder_is_refused(tmp_path: Path, sharded: Path) -> None:
    secret = tmp_path / "id_rsa"
    secret.write_text("secret")
    (sharded / "README.md").symlink_to(secret)
    for args in (["report", sharded], ["prune", sharded, tmp_path / "out", "--method", "identity"]):
        result = _invoke(*args)
        assert result.exit_code == 1 and result.stdout == ""
        assert "holds links that lead out of it (README.md -> " in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_an_index_naming_a_file_outside_the_folder_is_refused(tmp_path: Path, sharded: Path) -> None:
    index = sharded / "model.safetensors.index.json"
    content = json.loads(index.read_text())
    name = next(iter(content["weight_map"]))
    content["weight_map"][name] = "../elsewhere.safetensors"
    index.write_text(json.dumps(content))
    result = _invoke("report", sharded)
    assert result.exit_code == 1 and "names '../elsewhere.safetensors', which leads out of it" in result.stderr


def test_an_index_that_misplaces_a_tensor_is_refused(sharded: Path) -> None:
    index = sharded / "model.safetensors.index.json"
    content = json.loads(index.read_text())
    content["weight_map"]["model.norm.weight"] = "model-00001-of-00005.safetensors"
    index.write_text(json.dumps(content))
    result = _invoke("report", sharded)
    assert result.exit_code == 1
    assert (
        "model.safetensors.index.json puts tensor 'model.norm.weight' in model-00001-of-00005.safetensors"
        in result.stderr
    )


def test_an_index_swapped_for_a_fifo_while_the_shards_are_read_is_refused(
    sharded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index was read again by name, not through the checked opener: a FIFO swapped in meanwhile blocked it."""
    index = sharded / "model.safetensors.index.json"
    read = _checkpoint.read

    def read_then_swap(path: Path) -> _checkpoint.Checkpoint:
        if index.is_file():
            index.unlink()
            os.mkfifo(index)
        return read(path)

    monkeypatch.setattr(_checkpoint, "read", read_then_swap)
    with fifo_unblocker(index):
        result = _invoke("report", sharded)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: '{index}' is a FIFO (named pipe), not a regular file; "
        "replace it with the model's own model.safetensors.index.json\n"
    )


def test_a_fifo_in_the_folder_is_never_opened_and_said_left_out(tmp_path: Path, sharded: Path) -> None:
    os.mkfifo(sharded / "pipe")
    (sharded / "extra").mkdir()
    result = _invoke("prune", sharded, tmp_path / "out", "--method", "identity")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == "note: not copied to OUTPUT: 'extra', 'pipe'\n"
    assert not (tmp_path / "out" / "pipe").exists()


def test_output_folders_are_never_overwritten_nor_inside_the_input(tmp_path: Path, sharded: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("keep")
    before = _tree(sharded)
    cases = [
        ([taken], f"OUTPUT '{taken}' exists and is not empty; pass --force to replace it"),
        ([sharded / "sub"], "is inside INPUT"),
        ([sharded, "--force"], "is INPUT"),
        ([tmp_path / "out.safetensors"], "must be a folder like INPUT"),
        ([tmp_path / "o", "--masks", sharded / "m.safetensors"], "is inside INPUT"),
    ]
    for extra, message in cases:
        result = _invoke("prune", sharded, *extra, "--method", "identity")
        assert result.exit_code == 1 and message in result.stderr, (extra, result.stderr)
    assert _tree(sharded) == before and _tree(taken) == {"keep.txt": b"keep"}
    assert sorted(os.listdir(tmp_path)) == ["model", "taken"]
    replaced = _invoke("prune", sharded, taken, "--method", "identity", "--force")
    assert replaced.exit_code == 0, replaced.stderr
    assert "keep.txt" not in os.listdir(taken) and "config.json" in os.listdir(taken)


def test_a_masks_file_that_appears_meanwhile_takes_the_folder_back(
    tmp_path: Path, sharded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    masks = tmp_path / "masks.safetensors"
    real_save = _checkpoint.save

    def save_while_another_run_writes_the_masks(*args: object) -> None:
        real_save(*args)  # type: ignore[arg-type]
        masks.write_bytes(b"another run's masks")

    monkeypatch.setattr(_checkpoint, "save", save_while_another_run_writes_the_masks)
    result = _invoke("prune", sharded, tmp_path / "out", "--method", "identity", "--masks", masks)
    assert result.exit_code == 1 and f"MASKS_FILE '{masks}' exists" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["masks.safetensors", "model"]
    assert masks.read_bytes() == b"another run's masks"
