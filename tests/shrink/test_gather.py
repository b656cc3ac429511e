"""The statistics shrink methods read: running moments merged batch by batch equal the float64 ones over all tokens."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunereg._runtime.parts import Cut
from prunereg._shrink.gather import RunningMoments


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=6),
    offset=st.floats(min_value=-100, max_value=100),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_moments_merged_over_any_batches_equal_those_of_all_tokens_at_once(
    sizes: list[int], offset: float, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    batches = [torch.randn(size, 5, generator=generator, dtype=torch.float64) + offset for size in sizes]
    running = RunningMoments()
    for index, batch in enumerate(batches):  # [tokens, channels] or [batch, seq, channels]: every leading index a token
        running.add(batch.float().unsqueeze(0) if index % 2 else batch.float())
    tokens = torch.cat(batches)
    result = running.result()
    assert result.n_tokens == tokens.shape[0]
    assert result.mean is not None and result.variance is not None and result.sq_norms is not None
    torch.testing.assert_close(result.mean.double(), tokens.mean(0), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(result.sq_norms.double(), tokens.square().sum(0), rtol=1e-5, atol=1e-3)
    if tokens.shape[0] > 1:
        torch.testing.assert_close(result.variance.double(), tokens.var(0), rtol=1e-3, atol=1e-4)


def test_no_tokens_give_empty_statistics() -> None:
    running = RunningMoments()
    running.add(torch.empty(0, 4))
    assert running.result().n_tokens == 0 and running.result().mean is None


def test_a_cut_keeps_each_units_entries_in_every_segment() -> None:
    cut = Cut(torch.nn.Linear(1, 1), "weight", 0, ((0, 2), (6, 1)))  # units of 2 entries, then 1 entry each
    assert cut.kept_entries(torch.tensor([0, 2])).tolist() == [0, 1, 4, 5, 6, 8]


def _first_block_inputs(model: torch.nn.Module, n_batches: int) -> tuple[torch.nn.Module, Any]:
    from prunereg._runtime.capture import capture_first_block_inputs
    from tests.shrink.models import calibration_ids

    block = model.model.layers[0]
    ids = calibration_ids(samples=2 * n_batches, length=8)
    with torch.no_grad():
        return block, capture_first_block_inputs(model, block, list(ids.split(2)))


def _writers(block: torch.nn.Module) -> dict[str, torch.nn.Module]:
    return {"heads": block.self_attn.o_proj, "mlp": block.mlp.down_proj}


def _calls(module: torch.nn.Module, counter: list[int]) -> Any:
    def count(*_: object) -> None:
        counter[0] += 1

    return module.register_forward_hook(count)


def test_a_pass_that_feeds_nothing_skips_the_products_after_the_last_writer_with_the_same_statistics() -> None:
    from prunereg._shrink.gather import observe_block
    from tests.shrink.models import tiny_llama

    block, inputs = _first_block_inputs(tiny_llama(0, layers=2), n_batches=4)
    down_calls = [0]
    with torch.no_grad():
        whole = observe_block(block, inputs, _writers(block), None, 0, cosine=False, keep_outputs=True)
        handle = _calls(block.mlp.down_proj, down_calls)
        stopped = observe_block(block, inputs, _writers(block), None, 0, cosine=False, keep_outputs=False)
        handle.remove()
    assert down_calls[0] == 1  # the first batch runs whole (to learn the order), the next three stop at its input
    assert len(whole.outputs) == 4 and stopped.outputs == []
    for kind in ("heads", "mlp"):
        expected, got = whole.channels[kind], stopped.channels[kind]
        assert got.n_tokens == expected.n_tokens == 4 * 2 * 8
        for field in ("sq_norms", "mean", "variance"):
            assert torch.equal(getattr(got, field), getattr(expected, field))


def test_a_pass_that_takes_the_cosine_runs_every_forward_whole() -> None:
    from prunereg._shrink.gather import observe_block
    from tests.shrink.models import tiny_llama

    block, inputs = _first_block_inputs(tiny_llama(0, layers=2), n_batches=3)
    down_calls = [0]
    handle = _calls(block.mlp.down_proj, down_calls)
    with torch.no_grad():
        observation = observe_block(block, inputs, _writers(block), None, 0, cosine=True, keep_outputs=False)
    handle.remove()
    assert down_calls[0] == 3 and observation.block.n_tokens == 3 * 2 * 8


class _CallsItsLayerTwice(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared, self.out = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(self.shared(self.shared(hidden)))


def _observe_twice_caller(n_batches: int, watch_shared: bool) -> tuple[int, Any]:
    """Observe a :class:`_CallsItsLayerTwice` over ``n_batches``: its ``out`` layer's calls and the observation."""
    from prunereg._runtime.capture import BlockInputs
    from prunereg._shrink.gather import observe_block

    block = _CallsItsLayerTwice()
    inputs = BlockInputs([torch.randn(2, 3, 4) for _ in range(n_batches)], [()] * n_batches, [{}] * n_batches)
    writers = {"mlp": block.shared} if watch_shared else {}
    out_calls = [0]
    handle = _calls(block.out, out_calls)
    with torch.no_grad():
        observation = observe_block(block, inputs, writers, None, 0, cosine=False, keep_outputs=False)
    handle.remove()
    return out_calls[0], observation


def test_a_writer_called_twice_per_forward_keeps_every_forward_whole() -> None:
    out_calls, observation = _observe_twice_caller(3, watch_shared=True)
    assert out_calls == 3 and observation.channels["mlp"].n_tokens == 3 * 2 * 2 * 3


def test_a_pass_with_nothing_to_watch_runs_every_forward_whole() -> None:
    out_calls, observation = _observe_twice_caller(2, watch_shared=False)
    assert out_calls == 2 and observation.channels == {}
