"""GradualPruningCallback in a real Lightning Trainer.fit, stopped at a checkpoint and resumed from it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import prunereg

pl = pytest.importorskip("lightning.pytorch")

pytestmark = pytest.mark.filterwarnings("ignore")  # Lightning's advice on workers, logging and checkpoints


class TinyModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
        self.logged: list[dict[str, float]] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)

    def log_dict(self, dictionary, *args, **kwargs) -> None:  # type: ignore[no-untyped-def, override]
        self.logged.append({key: float(value) for key, value in dictionary.items()})
        super().log_dict(dictionary, *args, **kwargs)


def batches() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 6, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def callback() -> prunereg.GradualPruningCallback:
    schedule = prunereg.schedule("cubic", final=0.75, start=2, end=14, every=4)
    return prunereg.GradualPruningCallback("l1_unstructured", schedule, rewind_to=1, optimizer_state="reset")


def trainer(*callbacks: pl.Callback, **settings: object) -> pl.Trainer:
    """A quiet CPU Trainer; without a ModelCheckpoint among ``callbacks``, one that saves none."""
    saves = any(isinstance(callback, pl.callbacks.ModelCheckpoint) for callback in callbacks)
    return pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=saves,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        **settings,
    )


def fit(root: Path, epochs: int, resume: Path | None = None) -> tuple[TinyModel, prunereg.GradualPruningCallback]:
    model, pruning = TinyModel(), callback()
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=root, save_top_k=-1, every_n_epochs=1)
    trainer(pruning, checkpoints, max_epochs=epochs, default_root_dir=root).fit(model, batches(), ckpt_path=resume)
    return model, pruning


def test_fit_prunes_on_schedule_and_resumes_from_a_checkpoint_bit_for_bit(tmp_path):
    whole, pruning = fit(tmp_path / "whole", epochs=3)  # 8 steps an epoch: pruning at 2, 6, 10, 14
    assert pruning.pruner is not None and pruning.pruner.steps_done == 24
    sparsities = pruning.pruner.sparsities()
    assert sparsities == {"net.0.weight": 0.75, "net.2.weight": 0.75, "net.4.weight": 0.75}
    assert len(whole.logged) == 3  # at 6, 10 and 14 (at 2 the level is 0), each parameter once
    assert whole.logged[-1] == {f"sparsity/{name}": 0.75 for name in sparsities} | {"sparsity": 0.75}

    fit(tmp_path / "stopped", epochs=1)  # one epoch: step 8, between two pruning steps
    [checkpoint] = (tmp_path / "stopped").glob("*.ckpt")
    resumed, resumed_pruning = fit(tmp_path / "resumed", epochs=3, resume=checkpoint)
    assert resumed_pruning.pruner is not None
    assert resumed_pruning.pruner.state_dict() == pruning.pruner.state_dict()
    for (name, mine), theirs in zip(resumed.state_dict().items(), whole.state_dict().values()):
        assert torch.equal(mine, theirs), name
    assert any(name.endswith("weight_rewind") for name in whole.state_dict())


def test_a_method_that_cannot_reach_the_schedule_stops_fit_before_the_first_step(tmp_path):
    model = TinyModel()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    pruning = prunereg.GradualPruningCallback("identity", prunereg.schedule("linear", final=0.5, end=4))
    with pytest.raises(TypeError, match="'identity' cannot be given amount="):
        trainer(pruning, max_steps=4).fit(model, batches())
    assert {name: value for name, value in model.state_dict().items()}.keys() == before.keys()
    assert all(torch.equal(model.state_dict()[name], value) for name, value in before.items())


class SharedLayerModel(TinyModel):
    """One Linear used twice (Lightning #13595 counted it twice): pruned and logged once."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(16, 16)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), shared, nn.ReLU(), shared, nn.ReLU(), nn.Linear(16, 1))


def test_a_layer_used_twice_is_logged_once_with_its_true_sparsity_under_gradient_accumulation():
    model = SharedLayerModel()
    schedule = prunereg.schedule("linear", final=0.5, start=0, end=4, every=2)
    pruning = prunereg.GradualPruningCallback("l1_unstructured", schedule)
    trainer(pruning, max_epochs=1, accumulate_grad_batches=2).fit(model, batches())  # 8 batches, 4 optimizer steps
    assert pruning.pruner is not None and pruning.pruner.steps_done == 4
    expected = {"sparsity/net.0.weight": 0.5, "sparsity/net.2.weight": 0.5, "sparsity/net.6.weight": 0.5}
    assert model.logged == [{name: 0.25 for name in expected} | {"sparsity": 0.25}, expected | {"sparsity": 0.5}]
    assert model.net[2].weight_mask is model.net[4].weight_mask
    zeros = sum(int((layer.weight_mask == 0).sum()) for layer in (model.net[0], model.net[2], model.net[6]))
    assert zeros == (96 + 256 + 16) // 2


def test_a_callback_used_for_a_second_module_prunes_that_module():
    schedule = prunereg.schedule("linear", final=0.5, start=0, end=4, every=2)
    pruning = prunereg.GradualPruningCallback("l1_unstructured", schedule)
    models = [TinyModel(), TinyModel()]
    for model in models:
        trainer(pruning, max_steps=4).fit(model, batches())
        assert model.logged[-1]["sparsity"] == 0.5
    assert all(prunereg.is_pruned(model) for model in models)
