"""Schedules: torch.ao.pruning's CubicSL levels step for step, the other kinds' closed forms, bad ones refused."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.ao.pruning import CubicSL, WeightNormSparsifier

import prunereg


def torch_levels(initial: float, final: float, start: int, every: int, rounds: int, steps: int) -> list[float]:
    """CubicSL's level after each of ``steps`` scheduler steps, on a real WeightNormSparsifier."""
    model = nn.Sequential(nn.Linear(4, 4))
    sparsifier = WeightNormSparsifier(sparsity_level=final)
    sparsifier.prepare(model, config=[{"tensor_fqn": "0.weight"}])
    scheduler = CubicSL(sparsifier, init_sl=initial, init_t=start, delta_t=every, total_t=rounds, initially_zero=True)
    levels = [scheduler.get_last_sl()[0]]
    for _ in range(steps):
        sparsifier.step()
        scheduler.step()
        levels.append(scheduler.get_last_sl()[0])
    return levels


@settings(max_examples=40, deadline=None)
@given(
    final=st.floats(0.05, 0.99),
    initial_share=st.floats(0.0, 1.0),
    start=st.integers(0, 20),
    every=st.integers(1, 7),
    rounds=st.integers(1, 9),
)
def test_cubic_equals_torch_ao_cubicsl_at_every_pruning_step_and_holds_between(
    final, initial_share, start, every, rounds
):
    initial = final * initial_share
    ours = prunereg.schedule(
        "cubic", initial=initial, final=final, start=start, end=start + every * rounds, every=every
    )
    theirs = torch_levels(initial, final, start, every, rounds, steps=start + every * rounds + 3)
    for step, level in enumerate(theirs):
        if ours.prunes_at(step) or step < start:
            assert ours(step) == level, step  # bit for bit
        else:  # between pruning steps the level of the latest one holds
            assert ours(step) == theirs[start + (min(step, ours.end) - start) // every * every]


def test_with_every_one_cubic_equals_cubicsl_at_every_step():
    ours = prunereg.schedule("cubic", initial=0.1, final=0.9, start=3, end=50)
    assert [ours(t) for t in range(60)] == torch_levels(0.1, 0.9, 3, 1, 47, steps=59)


def test_linear_constant_and_exponential_levels():
    linear = prunereg.schedule("linear", initial=0.2, final=0.8, start=10, end=40, every=10)
    assert [linear(t) for t in (0, 9, 10, 19, 20, 30, 40, 1000)] == pytest.approx([0, 0, 0.2, 0.2, 0.4, 0.6, 0.8, 0.8])
    constant = prunereg.schedule("constant", final=0.5, start=7)
    assert [constant(t) for t in (0, 6, 7, 100)] == [0, 0, 0.5, 0.5]
    assert list(constant.steps()) == [7]
    imp = prunereg.schedule("exponential", final=0.9, start=0, end=300, every=100)
    survivors = [1 - imp(t) for t in (0, 100, 200, 300)]
    assert survivors[0] == 1 and imp(300) == 0.9
    shares = [b / a for a, b in itertools.pairwise(survivors[1:])]
    assert shares == pytest.approx([survivors[1]] * 2)  # the same share of the survivors each round
    assert survivors[1] == pytest.approx(0.1 ** (1 / 3))


def test_a_function_is_asked_once_per_pruning_step_when_the_schedule_is_built():
    asked = []

    def level(step: int) -> float:
        asked.append(step)
        return min(step / 100, 0.5)

    schedule = prunereg.schedule(level, start=0, end=60, every=20)
    assert asked == [0, 20, 40, 60]
    assert [schedule(t) for t in (0, 19, 20, 59, 60, 61)] == [0.0, 0.0, 0.2, 0.4, 0.5, 0.5]
    assert asked == [0, 20, 40, 60]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"kind": "cubic", "final": 0.9, "start": 10, "end": 5}, ValueError, "end=5 is before start=10"),
        ({"kind": "cubic", "final": 1.0, "end": 10}, ValueError, r"final sparsity must be in \[0, 1\), got 1.0"),
        ({"kind": "linear", "final": -0.1, "end": 10}, ValueError, "must be in"),
        ({"kind": "linear", "final": 0.5, "initial": 0.7, "end": 10}, ValueError, "initial sparsity 0.7 is above"),
        ({"kind": "cubic", "final": 0.5, "end": 10, "every": 3}, ValueError, "not a multiple of every=3"),
        ({"kind": "cubic", "final": 0.5}, ValueError, "needs end="),
        ({"kind": "cubic", "final": 0.5, "start": 4, "end": 4}, ValueError, "needs end after start=4"),
        ({"kind": "cubic", "end": 10}, ValueError, "needs final="),
        ({"kind": "quadratic", "final": 0.5, "end": 10}, ValueError, "must be one of constant, linear"),
        ({"kind": "cubic", "final": "0.5", "end": 10}, TypeError, "must be a number"),
        ({"kind": "cubic", "final": 0.5, "end": 10.0}, TypeError, "whole number of steps"),
        ({"kind": "cubic", "final": 0.5, "end": 10, "every": 0}, ValueError, "every must be at least 1"),
        ({"kind": lambda t: 1.5, "end": 10}, ValueError, r"function at step 0 must be in \[0, 1\), got 1.5"),
        ({"kind": lambda t: 0.5, "final": 0.5, "end": 10}, ValueError, "takes no final="),
    ],
)
def test_bad_schedules_are_one_line_errors(kwargs, error, message):
    kind = kwargs.pop("kind")
    with pytest.raises(error, match=message) as raised:
        prunereg.schedule(kind, **kwargs)
    assert "\n" not in str(raised.value)


def test_exponential_levels_rise_from_initial_to_exactly_final():
    schedule = prunereg.schedule("exponential", initial=0.3, final=0.95, start=0, end=70, every=7)
    assert schedule(70) == 0.95 and schedule(0) == pytest.approx(0.3)
    assert all(0.3 <= level <= 0.95 for level in schedule.levels)
    assert not math.isnan(schedule.final_level)
    assert torch.tensor(schedule.levels).diff().min() >= 0


@pytest.mark.parametrize(("step", "error"), [(2.0, TypeError), (True, TypeError), ("2", TypeError), (-1, ValueError)])
def test_a_step_that_is_no_step_number_is_a_one_line_error(step, error):
    schedule = prunereg.schedule("linear", final=0.5, end=4)
    with pytest.raises(error, match="schedule step must be"):
        schedule(step)


def test_a_schedule_is_built_and_read_without_importing_torch():
    """``prunereg.schedule`` is plain arithmetic: a config or a CLI can build one in a process without torch."""
    import subprocess
    import sys

    probe = (
        "import sys, prunereg\n"
        "s = prunereg.schedule('cubic', final=0.5, start=0, end=10, every=2)\n"
        "assert s(10) == 0.5\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False", done.stderr
