"""InputNorms and linear_layers: norms from forward hooks, and hooks that never outlive the block."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from prunereg_wanda import InputNorms, linear_layers


def test_norms_by_hand_across_batches_and_token_dims() -> None:
    linear = nn.Linear(4, 2)
    first = torch.tensor([[2.0, 0.3, 0.0, 0.0]])
    second = torch.tensor([[[0.0, 0.4, 1.0, 4.0]], [[0.0, 0.0, 0.0, 0.0]]])  # (batch, tokens, features)
    with InputNorms({"fc": linear}) as recorder:
        linear(first)
        linear(input=second)
    torch.testing.assert_close(recorder.norms()["fc"], torch.tensor([2.0, 0.5, 1.0, 4.0]))
    assert recorder.tokens == {"fc": 3}


def test_half_precision_inputs_do_not_overflow() -> None:
    linear = nn.Linear(2, 1).half()
    with InputNorms({"fc": linear}) as recorder:
        linear(torch.full((4, 2), 200.0, dtype=torch.half))  # squares sum to 160000 > float16's max
    norms = recorder.norms()["fc"]
    assert norms.dtype == torch.float32
    torch.testing.assert_close(norms, torch.full((2,), 400.0))


def test_hooks_are_removed_after_the_block() -> None:
    linear = nn.Linear(3, 1)
    with InputNorms({"fc": linear}) as recorder:
        assert len(linear._forward_pre_hooks) == 1
        linear(torch.ones(1, 3))
    assert not linear._forward_pre_hooks
    linear(torch.full((1, 3), 5.0))
    torch.testing.assert_close(recorder.norms()["fc"], torch.ones(3))


def test_hooks_are_removed_when_the_block_raises() -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    with pytest.raises(RuntimeError, match="shape"):
        with InputNorms(linear_layers(model)):
            model(torch.ones(1, 5))
    assert all(not layer._forward_pre_hooks for layer in model)


def test_a_layer_without_input_is_reported() -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    with InputNorms(linear_layers(model)) as recorder:
        model[0](torch.ones(1, 3))
    with pytest.raises(RuntimeError, match="'1'"):
        recorder.norms()


def test_entering_twice_is_refused() -> None:
    linear = nn.Linear(3, 1)
    recorder = InputNorms({"fc": linear})
    with recorder:
        with pytest.raises(RuntimeError, match="already recording"):
            recorder.__enter__()
    assert not linear._forward_pre_hooks


def test_only_linear_layers_are_accepted() -> None:
    with pytest.raises(TypeError, match="Conv1d"):
        InputNorms({"conv": nn.Conv1d(1, 1, 1)})


def test_linear_layers_by_default_and_by_name() -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Sequential(nn.Linear(2, 1)))
    assert list(linear_layers(model)) == ["0", "2.0"]
    assert linear_layers(model, ["2.0"]) == {"2.0": model[2][0]}
    with pytest.raises(KeyError, match="'5'"):
        linear_layers(model, ["5"])
    with pytest.raises(TypeError, match="ReLU"):
        linear_layers(model, ["1"])
