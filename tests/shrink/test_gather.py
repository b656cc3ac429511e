"""The statistics shrink methods read, gathered in one pass over a block: forwards stopped only where nothing follows.

The moments themselves are tested with the other built-in statistics (``tests/runtime/test_standard.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from prunereg._runtime.parts import Cut
from tests.support.statistics import CallsItsLayerTwice

MOMENTS = frozenset({"channel_moments"})
COSINE = frozenset({"block_cosine"})


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
        whole = observe_block(block, inputs, _writers(block), None, MOMENTS, keep_outputs=True)
        handle = _calls(block.mlp.down_proj, down_calls)
        stopped = observe_block(block, inputs, _writers(block), None, MOMENTS, keep_outputs=False)
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
        observation = observe_block(block, inputs, _writers(block), None, MOMENTS | COSINE, keep_outputs=False)
    handle.remove()
    assert down_calls[0] == 3 and observation.block.n_tokens == 3 * 2 * 8


def _observe_twice_caller(n_batches: int, watch_shared: bool) -> tuple[int, Any]:
    """Observe a :class:`CallsItsLayerTwice` over ``n_batches``: its ``out`` layer's calls and the observation."""
    from prunereg._runtime.capture import BlockInputs
    from prunereg._shrink.gather import observe_block

    block = CallsItsLayerTwice()
    inputs = BlockInputs([torch.randn(2, 3, 4) for _ in range(n_batches)], [()] * n_batches, [{}] * n_batches)
    writers = {"mlp": block.shared} if watch_shared else {}
    out_calls = [0]
    handle = _calls(block.out, out_calls)
    with torch.no_grad():
        observation = observe_block(block, inputs, writers, None, MOMENTS, keep_outputs=False)
    handle.remove()
    return out_calls[0], observation


def test_a_writer_called_twice_per_forward_keeps_every_forward_whole() -> None:
    out_calls, observation = _observe_twice_caller(3, watch_shared=True)
    assert out_calls == 3 and observation.channels["mlp"].n_tokens == 3 * 2 * 2 * 3


def test_a_pass_with_nothing_to_watch_runs_every_forward_whole() -> None:
    out_calls, observation = _observe_twice_caller(2, watch_shared=False)
    assert out_calls == 2 and observation.channels == {}
