"""mean_abs_sp and its statistic mean_abs_input: exact merges, the contract, and the channels prunereg.shrink cuts."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from prunereg_rotate.shrink import MeanAbsSP
from prunereg_rotate.statistic import AbsMean, MeanAbsInput
from rotate_helpers import logits, tiny_llama, token_ids

import prunereg
from prunereg import toolkit
from prunereg.testing import check_shrink_method


def gathered(batches: list[torch.Tensor]) -> MeanAbsInput:
    statistic = MeanAbsInput()
    for index, batch in enumerate(batches):
        statistic.fold(toolkit.Observation(index, batch))
    return statistic


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5), min_size=1, max_size=4),
    features=st.integers(1, 6),
    split=st.integers(0, 4),
    seed=st.integers(0, 2**16),
)
def test_folding_and_combining_give_the_mean_of_all_tokens(sizes, features, split, seed) -> None:
    generator = torch.Generator().manual_seed(seed)
    # Small integers: every sum is exact, so any order of merging must give the same bits.
    batches = [torch.randint(-8, 9, (2, size, features), generator=generator).float() for size in sizes]
    whole = gathered(batches)
    split = min(split, len(batches))
    first, second = gathered(batches[:split]), gathered(batches[split:])
    first.combine(second)
    tokens = torch.cat([batch.reshape(-1, features) for batch in batches])
    for statistic in (whole, first):
        result = statistic.result()
        if tokens.shape[0] == 0:
            assert result is None
            continue
        assert isinstance(result, AbsMean)
        assert result.n_tokens == tokens.shape[0]
        assert torch.equal(result.mean, tokens.abs().mean(0))
    assert second.result() is None or second.n_tokens == sum(2 * size for size in sizes[split:])


def test_combine_leaves_the_other_alone_and_refuses_another_statistic() -> None:
    mine, theirs = gathered([torch.ones(3, 2)]), gathered([torch.full((1, 2), -3.0)])
    kept = theirs.sums.clone()
    mine.combine(theirs)
    assert torch.equal(theirs.sums, kept)
    assert torch.equal(mine.result().mean, torch.tensor([1.5, 1.5]))
    with pytest.raises(TypeError, match="MeanAbsInput combines with another MeanAbsInput, not InputSqNorms"):
        mine.combine(toolkit.InputSqNorms())


def test_the_statistic_is_registered_for_methods_to_ask_for() -> None:
    assert MeanAbsInput.NAME in toolkit.statistic_names()
    assert toolkit.register_statistic(MeanAbsInput) is MeanAbsInput  # registering it again is accepted


def test_keeps_the_shrink_contract() -> None:
    check_shrink_method("mean_abs_sp")


def test_scores_mean_abs_activation_times_the_column_norm() -> None:
    weight = torch.tensor([[3.0, 0.0, 1.0], [4.0, 2.0, -1.0]])
    statistics = prunereg.ChannelStatistics(
        2, extra={"mean_abs_input": gathered([torch.tensor([[1.0, -2, 0], [-3, 2, 0]])]).result()}
    )
    scores = MeanAbsSP().channel_scores(weight, statistics)
    assert torch.equal(scores, torch.tensor([2.0 * 5.0, 2.0 * 2.0, 0.0]))


def test_refuses_to_score_without_calibration_tokens() -> None:
    statistics = prunereg.ChannelStatistics(0, extra={"mean_abs_input": None})
    with pytest.raises(ValueError, match="mean_abs_sp needs calibration tokens"):
        MeanAbsSP().channel_scores(torch.ones(2, 3), statistics)


def down_proj_inputs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """What block 0's down_proj reads on ``ids``, one row per token (a plain forward hook, the reference)."""
    seen = []
    handle = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda _, args, out: seen.append(args[0]))
    try:
        logits(model, ids)
    finally:
        handle.remove()
    return torch.cat([rows.reshape(-1, rows.shape[-1]) for rows in seen])


def test_shrink_cuts_the_channels_of_lowest_score_and_the_model_reloads(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    model = tiny_llama()
    dense = copy.deepcopy(model)
    calibration = token_ids(8, seed=1)
    report = prunereg.shrink(model, "mean_abs_sp", calibration, mlp=0.5, heads=0.5)
    assert model.config.intermediate_size == 24 and model.config.num_key_value_heads == 1
    assert report.method == "mean_abs_sp"
    # Block 0 reads the dense model's activations: its cut follows from a reference computed here.
    down = dense.model.layers[0].mlp.down_proj.weight.detach()
    scores = down_proj_inputs(dense, calibration).abs().mean(0) * down.norm(dim=0)
    kept = scores.topk(24).indices.sort().values
    assert torch.equal(model.model.layers[0].mlp.down_proj.weight, down[:, kept])
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    held_out = token_ids(4, seed=2)
    assert torch.equal(logits(reloaded, held_out), logits(model, held_out))


def test_shrink_and_channel_affine_in_one_pass() -> None:
    model = tiny_llama()
    report = prunereg.shrink(model, "mean_abs_sp", token_ids(8, seed=1), mlp=0.5, recover="channel_affine")
    assert report.recovery is not None
    steps = report.recovery.steps
    assert len(steps) == 2 and all(step.loss_after < step.loss_before for step in steps), str(report.recovery)
    assert model.config.intermediate_size == 24 and model.config.mlp_bias
