"""Cutting channels out of modules: the tensors shrink, the shape attributes follow, and a forward agrees."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from prunereg._slim.surgery import keep_indices, sync_shape_attributes


def test_a_linear_keeps_the_chosen_rows_and_reports_its_new_width() -> None:
    layer = nn.Linear(4, 6)
    old_weight, old_bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    keep = torch.tensor([0, 2, 5])
    keep_indices(layer, "weight", 0, keep)
    keep_indices(layer, "bias", 0, keep)
    sync_shape_attributes(layer)
    assert layer.out_features == 3 and layer.in_features == 4
    assert isinstance(layer.weight, nn.Parameter) and layer.weight.requires_grad
    torch.testing.assert_close(layer.weight, old_weight[keep])
    torch.testing.assert_close(layer.bias, old_bias[keep])


def test_a_batch_norm_cut_keeps_its_running_statistics_as_buffers() -> None:
    norm = nn.BatchNorm2d(5)
    norm.running_mean.copy_(torch.arange(5.0))
    keep = torch.tensor([1, 3])
    for name in ("weight", "bias", "running_mean", "running_var"):
        keep_indices(norm, name, 0, keep)
    sync_shape_attributes(norm)
    assert norm.num_features == 2
    assert "running_mean" in norm._buffers and norm.running_mean.tolist() == [1.0, 3.0]


def test_a_conv_cut_on_both_sides_matches_the_full_conv_on_the_kept_channels() -> None:
    conv = nn.Conv2d(4, 6, 3)
    x = torch.randn(1, 4, 8, 8)
    keep_out, keep_in = torch.tensor([0, 1, 4]), torch.tensor([1, 2])
    expected = nn.functional.conv2d(x[:, keep_in], conv.weight[keep_out][:, keep_in], conv.bias[keep_out])
    keep_indices(conv, "weight", 0, keep_out)
    keep_indices(conv, "bias", 0, keep_out)
    keep_indices(conv, "weight", 1, keep_in)
    sync_shape_attributes(conv)
    assert (conv.out_channels, conv.in_channels) == (3, 2)
    torch.testing.assert_close(conv(x[:, keep_in]), expected)


def test_layer_norm_and_embedding_shapes_follow_their_weights() -> None:
    norm, embedding = nn.LayerNorm(8), nn.Embedding(10, 8)
    keep = torch.tensor([0, 3, 7])
    for module in (norm, embedding):
        keep_indices(module, "weight", -1, keep)
        sync_shape_attributes(module)
    keep_indices(norm, "bias", 0, keep)
    assert norm.normalized_shape == (3,) and norm(torch.randn(2, 3)).shape == (2, 3)
    assert (embedding.num_embeddings, embedding.embedding_dim) == (10, 3)


def test_a_missing_bias_is_left_alone_and_bad_indices_change_nothing() -> None:
    layer = nn.Linear(3, 3, bias=False)
    keep_indices(layer, "bias", 0, torch.tensor([0]))
    before = layer.weight
    with pytest.raises(IndexError, match="outside"):
        keep_indices(layer, "weight", 0, torch.tensor([0, 3]))
    with pytest.raises(IndexError, match="dims"):
        keep_indices(layer, "weight", 2, torch.tensor([0]))
    assert layer.weight is before and layer.bias is None
