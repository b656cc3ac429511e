"""channel_affine: its closed form against a per-channel least-squares reference, the contract, what it recovers."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from prunereg_rotate.recovery import ChannelAffine, affine_fit
from rotate_helpers import logits, tiny_llama, token_ids

import prunereg
from prunereg.testing import check_recovery_method


def normal_equations(inputs: torch.Tensor, wanted: torch.Tensor) -> prunereg.NormalEquations:
    ones = torch.cat([inputs, torch.ones(inputs.shape[0], 1, dtype=inputs.dtype)], dim=1)
    return prunereg.NormalEquations(ones.T @ ones, ones.T @ wanted, wanted.square().sum(0), inputs.shape[0])


def reference_fit(outputs: torch.Tensor, wanted: torch.Tensor, shift: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each output channel's least-squares (scale, shift) from the tokens themselves, by torch.linalg.lstsq."""
    scales, shifts = [], []
    for channel in range(outputs.shape[1]):
        y = outputs[:, channel : channel + 1]
        design = torch.cat([y, torch.ones_like(y)], dim=1) if shift else y
        solution = torch.linalg.lstsq(design, wanted[:, channel : channel + 1]).solution.squeeze(1)
        scales.append(solution[0])
        shifts.append(solution[1] if shift else torch.tensor(0.0, dtype=torch.float64))
    return torch.stack(scales), torch.stack(shifts)


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.integers(3, 40),
    inputs=st.integers(1, 6),
    outputs=st.integers(1, 5),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matches_a_per_channel_least_squares_reference(tokens, inputs, outputs, with_bias, seed) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, inputs, generator=generator, dtype=torch.float64)
    weight = torch.randn(outputs, inputs, generator=generator, dtype=torch.float64)
    bias = torch.randn(outputs, generator=generator, dtype=torch.float64) if with_bias else None
    wanted = torch.randn(tokens, outputs, generator=generator, dtype=torch.float64)
    current = x @ weight.T + (bias if bias is not None else 0)
    scale, shift = affine_fit(normal_equations(x, wanted), weight, bias)
    expected_scale, expected_shift = reference_fit(current, wanted, shift=with_bias)
    torch.testing.assert_close(scale, expected_scale, rtol=1e-7, atol=1e-9)
    if with_bias:
        assert shift is not None
        torch.testing.assert_close(shift, expected_shift, rtol=1e-7, atol=1e-9)
    else:
        assert shift is None


def test_a_constant_output_keeps_its_scale_and_gets_the_mean_shift() -> None:
    x = torch.randn(10, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    weight = torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]], dtype=torch.float64)
    bias = torch.tensor([0.5, 0.0], dtype=torch.float64)
    wanted = torch.stack([torch.linspace(0, 2, 10, dtype=torch.float64), x @ weight[1] * 2], dim=1)
    scale, shift = affine_fit(normal_equations(x, wanted), weight, bias)
    assert shift is not None
    assert float(scale[0]) == 1.0
    torch.testing.assert_close(shift[0], wanted[:, 0].mean() - 0.5, rtol=0, atol=1e-12)
    torch.testing.assert_close(scale[1], torch.tensor(2.0, dtype=torch.float64), rtol=0, atol=1e-10)


@pytest.mark.parametrize("options", [{}, {"bias": False}])
def test_keeps_the_recovery_contract(options: dict) -> None:
    check_recovery_method("channel_affine", **options)


def test_refuses_a_bias_that_is_not_a_bool() -> None:
    with pytest.raises(TypeError, match="bias must be True or False"):
        ChannelAffine(bias=1)  # type: ignore[arg-type]


def test_brings_a_shrunk_model_closer_and_it_reloads(tmp_path) -> None:
    calibration, held_out = token_ids(8, seed=1), token_ids(4, seed=2)
    transformers = pytest.importorskip("transformers")
    model = tiny_llama()
    dense = copy.deepcopy(model)
    prunereg.shrink(model, "magnitude_sp", mlp=0.5)
    shrunk = copy.deepcopy(model)
    report = prunereg.recover(model, dense, calibration, "channel_affine")
    assert [step.index for step in report.steps] == [0, 1]
    assert all(step.loss_after < step.loss_before for step in report.steps), str(report)
    assert not report.undone
    assert model.config.mlp_bias
    error = {name: float((logits(m, held_out) - logits(dense, held_out)).norm()) for name, m in
             (("shrunk", shrunk), ("recovered", model))}  # fmt: skip
    assert error["recovered"] < error["shrunk"], error
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(logits(reloaded, held_out), logits(model, held_out))


def test_a_pruned_model_keeps_every_zero() -> None:
    calibration = token_ids(8, seed=1)
    model = tiny_llama()
    dense = copy.deepcopy(model)
    with torch.no_grad():
        for block in model.model.layers:
            for linear in (block.mlp.down_proj, block.self_attn.o_proj):
                linear.weight.mul_(torch.rand(linear.weight.shape, generator=torch.Generator().manual_seed(3)) > 0.5)
    zeros = {name: p == 0 for name, p in model.named_parameters() if p.dim() == 2}
    report = prunereg.recover(model, dense, calibration, "channel_affine")
    assert all(step.loss_after < step.loss_before for step in report.steps), str(report)
    for name, parameter in model.named_parameters():
        if name in zeros:
            assert bool((parameter[zeros[name]] == 0).all()), name
