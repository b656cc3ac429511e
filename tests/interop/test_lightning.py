"""Lightning's ModelPruning callback runs with a prunereg method, as with torch's own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import prunereg

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.callbacks import ModelPruning  # noqa: E402


class TinyModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def batches() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def fit(pruning_fn: object) -> TinyModel:
    model = TinyModel()
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelPruning(pruning_fn=pruning_fn, amount=0.5, verbose=0)],
    )
    trainer.fit(model, batches())
    return model


@pytest.mark.filterwarnings("ignore")  # Lightning's advice on workers and logging
def test_model_pruning_with_a_prunereg_method_equals_torchs():
    mine = fit(prunereg.get("l1_unstructured"))
    theirs = fit(torch_prune.L1Unstructured)
    for a, b in zip(mine.net.parameters(), theirs.net.parameters()):
        assert torch.equal(a, b)
    zeros = sum(int((m.weight == 0).sum()) for m in mine.net if isinstance(m, nn.Linear))
    assert zeros >= (32 + 8) // 2  # pruned globally with weights and biases, twice
    assert not prunereg.is_pruned(mine)  # made permanent at the end of training
