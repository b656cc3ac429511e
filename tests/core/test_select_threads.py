"""The radix select under a busy CPU: its operations run on as many threads as their size pays for.

Timing is the benchmark's job (``benchmarks/cases.py``, "busy"); these tests check the
mechanism: the bound in force during the search, the caller's setting restored exactly
(also after an error), and the same masks with and without the bound.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from prunereg import toolkit
from prunereg._selection import select as _select
from prunereg._selection import threads

CUTOFF = _select.TOPK_CUTOFF["cpu"]


@pytest.fixture
def two_threads() -> Iterator[None]:
    """The caller runs torch on two threads (the tests run on one otherwise)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture
def threads_seen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread count in force each time the radix search runs."""
    seen: list[int] = []
    search = _select.find_threshold

    def recording(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return search(*args, **kwargs)

    monkeypatch.setattr(_select, "find_threshold", recording)
    return seen


def large_scores(seed: int = 0) -> torch.Tensor:
    return torch.randn(4 * CUTOFF, generator=torch.Generator().manual_seed(seed)).view(64, -1)


@pytest.mark.usefixtures("two_threads")
@pytest.mark.parametrize("path", ["prune_lowest", "select_k", "l1_unstructured"])
def test_the_radix_select_runs_on_one_thread_and_gives_the_callers_count_back(path, threads_seen):
    scores = large_scores()
    if path == "prune_lowest":
        toolkit.prune_lowest(scores, 1000, torch.ones_like(scores), magnitude=True)
    elif path == "select_k":
        toolkit.select_k([scores, scores[:3]], 1000)
    else:
        import prunereg.prune as prune

        prune.L1Unstructured(0.5).compute_mask(scores, torch.ones_like(scores))
    assert threads_seen and set(threads_seen) == {1}
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_global_pruning_streams_on_one_thread_and_gives_the_callers_count_back(monkeypatch):
    import prunereg.prune as prune
    from prunereg._selection import radix

    seen: list[int] = []
    search = radix.find_threshold

    def recording(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return search(*args, **kwargs)

    monkeypatch.setattr(radix, "find_threshold", recording)
    layers = [torch.nn.Linear(128, 64), torch.nn.Linear(128, 64)]
    prune.global_unstructured([(layer, "weight") for layer in layers], prune.L1Unstructured, amount=0.5)
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_the_callers_thread_count_comes_back_when_the_selection_fails(monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(_select, "find_threshold", failing)
    scores = large_scores()
    with pytest.raises(RuntimeError, match="out of memory"):
        toolkit.prune_lowest(scores, 10, torch.ones_like(scores))
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_small_inputs_and_other_devices_keep_the_callers_threads(threads_seen):
    small = torch.randn(CUTOFF)  # torch.topk, as torch does: no radix search, nothing bounded
    toolkit.prune_lowest(small, 10, torch.ones_like(small))
    assert threads_seen == []
    with threads.bounded_threads(1, torch.device("meta")) as count:
        assert count == torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_the_bound_grows_with_the_entries_per_operation_up_to_the_callers_count():
    per_thread = threads.ENTRIES_PER_THREAD
    assert threads.threads_for(_select.BLOCK) == 1  # a block is too small to pay for a second thread
    assert threads.threads_for(per_thread - 1) == 1
    assert threads.threads_for(2 * per_thread) == 2
    assert threads.threads_for(64 * per_thread) == 2  # never more than the caller asked for


@pytest.mark.usefixtures("two_threads")
@pytest.mark.parametrize("seed", [0, 1])
def test_masks_are_the_same_with_and_without_the_bound(monkeypatch, seed):
    scores = large_scores(seed).round(decimals=1)  # many ties at the threshold
    default = torch.ones_like(scores)
    bounded = (toolkit.prune_lowest(scores, 5000, default), toolkit.select_k([scores], 7000, largest=True)[0])
    monkeypatch.setattr(threads, "ENTRIES_PER_THREAD", 1)  # every operation gets the caller's two threads
    free = (toolkit.prune_lowest(scores, 5000, default), toolkit.select_k([scores], 7000, largest=True)[0])
    assert torch.equal(bounded[0], free[0]) and torch.equal(bounded[1], free[1])
