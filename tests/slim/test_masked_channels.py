"""ratio=None: the channels a structured method pruned are removed, and the outputs stay the masked model's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import prunereg
from tests.slim.helpers import assert_unchanged, exact_state, outputs


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8, bias=False)
        self.fc2 = nn.Linear(8, 8, bias=False)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class ResidualMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(6, 8, bias=False)
        self.inner = nn.Linear(8, 8, bias=False)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.head(h + self.inner(torch.relu(h)))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(8, 6, 3, padding=1, bias=False)
        self.fc = nn.Linear(6 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv2(torch.relu(self.conv1(x)))).flatten(1))


def test_an_mlp_loses_exactly_the_rows_ln_structured_pruned_and_computes_what_the_masked_model_did() -> None:
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(4, 6)
    prunereg.get("ln_structured").apply(model.fc1, "weight", amount=0.5, n=2, dim=0)
    masked = outputs(model, (x,))
    report = prunereg.slim(model, x)
    assert model.fc1.out_features == 4 and model.fc2.in_features == 4
    assert model.fc1.weight_mask.shape == (4, 6)  # the pruning stays, on the kept rows
    torch.testing.assert_close(outputs(model, (x,)), masked, rtol=0, atol=1e-5)
    assert report.ratio is None and report.params_after < report.params_before
    assert ("fc1.weight", (8, 6), (4, 6)) in [(c.name, c.before, c.after) for c in report.changes]


def test_a_cnn_loses_the_filters_ln_structured_pruned_and_its_flattened_linear_the_matching_columns() -> None:
    torch.manual_seed(0)
    model, x = CNN(), torch.randn(2, 3, 4, 4)
    prunereg.get("ln_structured").apply(model.conv2, "weight", amount=2, n=1, dim=0)
    masked = outputs(model, (x,))
    prunereg.slim(model, x)
    assert model.conv2.out_channels == 4 and model.fc.in_features == 4 * 4 * 4
    torch.testing.assert_close(outputs(model, (x,)), masked, rtol=0, atol=1e-5)


def test_random_structured_channels_go_too() -> None:
    torch.manual_seed(1)
    model, x = MLP(), torch.randn(3, 6)
    prunereg.get("random_structured").apply(model.fc2, "weight", amount=0.25, dim=0)
    masked = outputs(model, (x,))
    prunereg.slim(model, x)
    assert model.fc2.out_features == 6 and model.head.in_features == 6
    torch.testing.assert_close(outputs(model, (x,)), masked, rtol=0, atol=1e-5)


def test_a_residual_channel_pruned_in_one_addend_only_is_refused_naming_the_other_and_the_model_is_unchanged() -> None:
    torch.manual_seed(0)
    model, x = ResidualMLP(), torch.randn(2, 6)
    prunereg.get("ln_structured").apply(model.stem, "weight", amount=2, n=2, dim=0)
    before = exact_state(model)
    with pytest.raises(prunereg.SlimError, match=r"'inner.weight'.*keeps it"):
        prunereg.slim(model, x)
    assert_unchanged(model, before)


def test_a_residual_channel_pruned_in_every_addend_goes() -> None:
    torch.manual_seed(0)
    model, x = ResidualMLP(), torch.randn(2, 6)
    prunereg.get("ln_structured").apply(model.stem, "weight", amount=2, n=2, dim=0)
    rows = (model.stem.weight_mask.sum(1) == 0).float()
    prunereg.get("custom_from_mask").apply(model.inner, "weight", mask=(1 - rows)[:, None].expand(8, 8).clone())
    masked = outputs(model, (x,))
    prunereg.slim(model, x)
    assert model.stem.out_features == 6 and model.inner.weight.shape == (6, 6) and model.head.in_features == 6
    torch.testing.assert_close(outputs(model, (x,)), masked, rtol=0, atol=1e-5)


def test_pruned_rows_of_the_output_layer_are_refused_as_the_output_keeps_its_shape() -> None:
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(2, 6)
    prunereg.get("ln_structured").apply(model.head, "weight", amount=1, n=2, dim=0)
    before = exact_state(model)
    with pytest.raises(prunereg.SlimError, match="a model output keeps its shape"):
        prunereg.slim(model, x)
    assert_unchanged(model, before)


def test_a_layer_with_every_channel_pruned_is_refused() -> None:
    model, x = MLP(), torch.randn(2, 6)
    prunereg.get("ln_structured").apply(model.fc1, "weight", amount=1.0, n=2, dim=0)
    before = exact_state(model)
    with pytest.raises(prunereg.SlimError, match=r"every channel of 'fc1.weight'"):
        prunereg.slim(model, x)
    assert_unchanged(model, before)


def test_a_model_without_structured_pruning_is_left_as_it_was() -> None:
    model, x = MLP(), torch.randn(2, 6)
    prunereg.get("l1_unstructured").apply(model.fc1, "weight", amount=0.5)
    report = prunereg.slim(model, x)
    assert report.removed == 0 and report.changes == [] and model.fc1.out_features == 8


def test_rows_pruned_inside_an_attention_head_stay_with_a_note_as_heads_go_whole() -> None:
    torch.manual_seed(0)
    model, x = nn.MultiheadAttention(8, 2), torch.randn(5, 1, 8)
    wrapper = _SelfAttention(model)
    prunereg.get("ln_structured").apply(model, "in_proj_weight", amount=1, n=2, dim=0)
    report = prunereg.slim(wrapper, x)
    assert model.in_proj_weight.shape == (24, 8) and report.removed == 0
    assert any("not entirely pruned" in note for note in report.notes)


class _SelfAttention(nn.Module):
    def __init__(self, attention: nn.MultiheadAttention) -> None:
        super().__init__()
        self.attention = attention
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention(self.proj(x), self.proj(x), self.proj(x))[0]


class BiasedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def test_a_pruned_channel_whose_bias_stays_is_removed_with_a_warning_that_the_outputs_moved() -> None:
    torch.manual_seed(0)
    model, x = BiasedMLP(), torch.randn(2, 6)
    with torch.no_grad():
        model.fc1.bias.fill_(0.5)
    prunereg.get("ln_structured").apply(model.fc1, "weight", amount=2, n=2, dim=0)
    with pytest.warns(UserWarning, match="carried a bias"):
        report = prunereg.slim(model, x)
    assert model.fc1.out_features == 6 and any("carried a bias" in note for note in report.notes)


def test_pruning_the_bias_with_its_rows_keeps_the_outputs_exact_and_says_nothing(
    recwarn: pytest.WarningsRecorder,
) -> None:
    torch.manual_seed(0)
    model, x = BiasedMLP(), torch.randn(2, 6)
    prunereg.get("ln_structured").apply(model.fc1, "weight", amount=2, n=2, dim=0)
    rows = model.fc1.weight_mask[:, 0].clone()
    prunereg.get("custom_from_mask").apply(model.fc1, "bias", mask=rows)
    masked = outputs(model, (x,))
    report = prunereg.slim(model, x)
    assert model.fc1.out_features == 6 and model.fc1.bias.shape == (6,) and report.notes == []
    torch.testing.assert_close(outputs(model, (x,)), masked, rtol=0, atol=1e-5)
    assert not [w for w in recwarn if "carried a bias" in str(w.message)]
