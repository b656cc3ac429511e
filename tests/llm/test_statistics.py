"""Calibration statistics: the explicit formulas, gathered once per group of layers reading one input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunereg._runtime.recorder import GRAM_TILE, GroupRecorder, RunningStatistics


@settings(max_examples=25, deadline=None)
@given(
    batches=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 5)), min_size=1, max_size=4),
    width=st.integers(1, 6),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
)
def test_running_statistics_equal_the_formulas_over_all_tokens(batches, width, dtype):
    torch.manual_seed(0)
    inputs = [torch.randn(b, t, width).to(dtype) for b, t in batches]
    running = RunningStatistics({"input_sq_norms", "hessian"})
    for x in inputs:
        running.add(x)
    result = running.result()
    tokens = torch.cat([x.reshape(-1, width) for x in inputs]).double()
    n = tokens.shape[0]
    assert result.n_tokens == n
    assert result.input_sq_norms.dtype == result.hessian.dtype == torch.float32
    assert torch.allclose(result.input_sq_norms.double(), (tokens**2).sum(0), rtol=1e-5, atol=1e-5)
    assert torch.allclose(result.hessian.double(), 2 / n * tokens.T @ tokens, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("width", [GRAM_TILE - 1, GRAM_TILE, GRAM_TILE + 1, 2 * GRAM_TILE + 88])
def test_a_hessian_wider_than_a_tile_is_summed_by_upper_tiles_and_comes_out_symmetric(width):
    torch.manual_seed(0)
    batches = [torch.randn(3, 40, width), torch.randn(1, 17, width)]
    running = RunningStatistics({"hessian"})
    for x in batches:
        running.add(x)
    hessian = running.result().hessian
    tokens = torch.cat([x.reshape(-1, width) for x in batches]).double()
    assert torch.equal(hessian, hessian.T)
    assert torch.allclose(hessian.double(), 2 / tokens.shape[0] * tokens.T @ tokens, rtol=1e-5, atol=1e-5)
    assert torch.equal(running.result().hessian, hessian)  # asking twice gives the same matrix


def test_the_hessian_is_summed_in_full_float32_even_inside_faster_forwards():
    torch.manual_seed(0)
    x = torch.randn(512, 256)
    exact = RunningStatistics({"hessian"})
    exact.add(x)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        inside = RunningStatistics({"hessian"})
        inside.add(x)
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.equal(inside.result().hessian, exact.result().hessian)


def test_only_the_statistics_asked_for_are_gathered():
    running = RunningStatistics({"input_sq_norms"})
    running.add(torch.ones(2, 3))
    result = running.result()
    assert result.hessian is None and result.input_sq_norms.tolist() == [2.0, 2.0, 2.0]


class _TwoBranches(torch.nn.Module):
    """a and b read the same tensor; c reads another; d is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (torch.nn.Linear(4, 4) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.a(x) + self.b(x)))


def test_layers_reading_one_tensor_form_one_group_with_one_hook_after_the_first_batch():
    torch.manual_seed(0)
    model = _TwoBranches()
    layers = dict(model.named_children())
    inputs = [torch.randn(2, 5, 4) for _ in range(3)]
    calls_of_c = []
    model.c.register_forward_hook(lambda *_: calls_of_c.append(1))
    with GroupRecorder(layers, {"input_sq_norms"}) as recorder:
        for x in inputs:
            with recorder.batch():
                model(x)
        assert sum(len(layer._forward_pre_hooks) for layer in layers.values()) == 2
    # Once the groups are known, the forward stops before the last group's layer runs.
    assert len(calls_of_c) == 1
    assert all(not layer._forward_pre_hooks for layer in layers.values())
    groups = recorder.group_statistics()
    assert [names for names, _ in groups] == [["a", "b"], ["c"]]
    tokens = torch.cat(inputs).reshape(-1, 4)
    assert groups[0][1].n_tokens == 30
    assert torch.allclose(groups[0][1].input_sq_norms, (tokens**2).sum(0), rtol=1e-5)
    hidden = torch.relu(model.a(tokens) + model.b(tokens))
    assert torch.allclose(groups[1][1].input_sq_norms, (hidden**2).sum(0), rtol=1e-5)


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        ("tiny_llama", [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["self_attn.o_proj"],
                        ["mlp.gate_proj", "mlp.up_proj"], ["mlp.down_proj"]]),
        ("tiny_gpt2", [["attn.c_attn"], ["attn.c_proj"], ["mlp.c_fc"], ["mlp.c_proj"]]),
        ("tiny_opt", [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["self_attn.out_proj"],
                      ["fc1"], ["fc2"]]),
    ],
)  # fmt: skip
def test_input_groups_of_real_decoder_blocks(build, expected):
    pytest.importorskip("transformers")
    from prunereg._runtime.blocks import find_blocks, prunable_layers
    from tests.support import tiny_lm as _tiny_lm

    model = getattr(_tiny_lm, build)()
    _, blocks = find_blocks(model)
    seen = {}

    def spy(module, args):
        seen.setdefault(module, []).append(args[0])

    handles = [layer.register_forward_pre_hook(spy) for layer in prunable_layers(blocks[0]).values()]
    layers = prunable_layers(blocks[0])
    with torch.no_grad(), GroupRecorder(layers, {"input_sq_norms"}) as recorder, recorder.batch():
        model(_tiny_lm.calibration_ids(2, 8))
    for handle in handles:
        handle.remove()
    groups = recorder.group_statistics()
    assert [names for names, _ in groups] == expected
    for names, statistics in groups:
        x = seen[layers[names[0]]][0].reshape(-1, seen[layers[names[0]]][0].shape[-1])
        assert statistics.n_tokens == 16
        assert torch.allclose(statistics.input_sq_norms, (x.float() ** 2).sum(0), rtol=1e-5)
