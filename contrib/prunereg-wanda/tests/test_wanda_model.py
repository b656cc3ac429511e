"""prune_model: calibrate, then prune every chosen Linear by Wanda, all or nothing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import prunereg
from prunereg_wanda import WandaPruning, prune_model


def small_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Dropout(0.5), nn.Linear(6, 4))


def batches() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(5, 8, generator=generator), torch.randn(2, 3, 8, generator=generator)]


def feature_norms(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).square().sum(0).sqrt()


def test_masks_equal_wanda_on_norms_measured_by_hand() -> None:
    model = small_model()
    inputs = torch.cat([b.reshape(-1, 8) for b in batches()])
    with torch.no_grad():
        hidden = torch.relu(model[0](inputs))  # eval mode: Dropout passes everything
    expected = {
        0: WandaPruning(0.5, feature_norms(inputs)).compute_mask(model[0].weight, torch.ones(6, 8)),
        3: WandaPruning(0.5, feature_norms(hidden)).compute_mask(model[3].weight, torch.ones(4, 6)),
    }
    prune_model(model, batches(), amount=0.5)
    for index, mask in expected.items():
        assert torch.equal(model[index].weight_mask, mask)
        assert (model[index].weight_mask == 0).sum(1).tolist() == [model[index].in_features // 2] * model[index].out_features


def test_only_the_named_layers_are_pruned() -> None:
    model = small_model()
    prune_model(model, batches(), amount=0.25, layers=["3"])
    assert not prunereg.is_pruned(model[0])
    assert prunereg.is_pruned(model[3])


def test_tuple_and_mapping_batches() -> None:
    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
            return self.fc(x * scale)

    model = TwoInputs()
    prune_model(model, [(torch.ones(1, 4), 2.0), {"x": torch.ones(1, 4), "scale": 3.0}], amount=0.5)
    assert (model.fc.weight_mask == 0).sum().item() == 4


def test_modes_are_restored() -> None:
    model = small_model()
    model.train()
    model[2].eval()
    prune_model(model, batches(), amount=0.5)
    assert [m.training for m in model.modules()] == [True, True, True, False, True]


def test_failure_on_a_later_layer_prunes_nothing() -> None:
    model = small_model()
    # 7 of each row: fine for the first layer (8 inputs), too many for the last (6 inputs).
    with pytest.raises(ValueError, match="amount=7"):
        prune_model(model, batches(), amount=7)
    assert not prunereg.is_pruned(model)
    assert [name for name, _ in model.named_parameters()] == ["0.weight", "0.bias", "3.weight", "3.bias"]
    assert all(not m._forward_pre_hooks for m in model.modules())


def test_failing_forward_leaves_no_hooks_and_prunes_nothing() -> None:
    model = small_model()
    model.train()
    with pytest.raises(RuntimeError):
        prune_model(model, [torch.ones(2, 3)], amount=0.5)
    assert all(not m._forward_pre_hooks for m in model.modules())
    assert all(m.training for m in model.modules())
    assert not prunereg.is_pruned(model)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"amount": 2.0}, ValueError, "amount=2.0"),
        ({"amount": 0.5, "layers": ["9"]}, KeyError, "'9'"),
        ({"amount": 0.5, "layers": []}, ValueError, "no nn.Linear"),
    ],
)
def test_bad_arguments_fail_before_calibration(kwargs, error, match) -> None:
    model = small_model()
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    with pytest.raises(error, match=match):
        prune_model(model, batches(), **kwargs)
    assert not calls
    assert not prunereg.is_pruned(model)


def test_wanda_scores_drive_two_of_four_sparsity() -> None:
    pytest.importorskip("prunereg_nm")
    from prunereg_wanda import InputNorms, wanda_scores

    torch.manual_seed(2)
    layer = nn.Linear(8, 3)
    with InputNorms({"fc": layer}) as recorder:
        layer(batches()[0])
    norms = recorder.norms()["fc"]
    prunereg.get("nm_sparsity").apply(layer, "weight", n=2, m=4, importance_scores=wanda_scores(layer.weight, norms))
    scores = wanda_scores(layer.weight_orig, norms).reshape(3, 2, 4)
    kept = layer.weight_mask.reshape(3, 2, 4).bool()
    assert bool((kept.sum(-1) == 2).all())
    # In every group, each kept score beats each pruned one.
    assert bool((scores.masked_fill(~kept, float("inf")).amin(-1) >= scores.masked_fill(kept, -1).amax(-1)).all())
