"""Sparsity schedules: the share of weights pruned after each training step.

A schedule prunes at the steps ``start, start + every, ..., end`` and holds its
level in between: ``schedule(t)`` is the sparsity a model pruned on schedule has
after ``t`` training steps (0 before ``start``, the final level from ``end``
on). The levels at the pruning steps are

- ``constant``: ``final`` at every pruning step (one-shot at ``start``);
- ``linear``: from ``initial`` to ``final`` in equal steps;
- ``cubic``: Zhu and Gupta's AGP curve, ``s_f + (s_i - s_f)(1 - (t - t0) / (n dt))^3``,
  computed as ``torch.ao.pruning.CubicSL`` computes it, bit for bit;
- ``exponential``: iterative magnitude pruning, the same share of the survivors each round;
- a callable ``f(step) -> float``, asked once per pruning step when the schedule is built.

Everything is checked when the schedule is built, so a bad one fails before training
starts, with a one-line error.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Callable
from typing import Any

from prunereg._runtime.options import check_sparsity

KINDS = ("constant", "linear", "cubic", "exponential")


class Schedule:
    """A sparsity schedule: ``"constant"``, ``"linear"``, ``"cubic"``, ``"exponential"`` or a function of the step.

    ``final`` is the sparsity reached at ``end`` (``initial`` the one at ``start``); the
    model is pruned at ``start, start + every, ..., end`` (``end - start`` a multiple of
    ``every``) and ``sched(step)`` is the sparsity it then has after ``step`` training
    steps. ``"cubic"`` equals ``torch.ao.pruning.CubicSL(init_sl=initial, init_t=start,
    delta_t=every, total_t=(end - start) // every)`` at every pruning step. A function
    ``f(step)`` gives the level at each pruning step; it is called for all of them now.
    Sparsities lie in [0, 1); any error is raised here, before training starts.
    ``prunereg.schedule`` is this class.
    """

    def __init__(
        self,
        kind: str | Callable[[int], float],
        *,
        final: float | None = None,
        initial: float = 0.0,
        start: int = 0,
        end: int | None = None,
        every: int = 1,
    ) -> None:
        self.start = _whole("start", start, 0)
        self.every = _whole("every", every, 1)
        gradual = kind != "constant"
        if end is None and gradual:
            raise ValueError(f"schedule({_name(kind)!r}) needs end=, the step of its last pruning")
        self.end = self.start if end is None else _whole("end", end, 0)
        if self.end < self.start:
            raise ValueError(f"schedule end={self.end} is before start={self.start}: end must come at or after start")
        if gradual and self.end == self.start:
            raise ValueError(f"schedule({_name(kind)!r}) needs end after start={self.start}: it prunes over steps")
        if (self.end - self.start) % self.every:
            raise ValueError(
                f"schedule end - start = {self.end - self.start} is not a multiple of every={self.every}: "
                "its last pruning step would miss end"
            )
        self.rounds = (self.end - self.start) // self.every
        if callable(kind):
            if final is not None or initial != 0.0:
                raise ValueError("a schedule given as a function takes no final= or initial=: the function gives both")
            self.kind = "function"
            self.initial = self.final = float("nan")
            self.levels = tuple(_level(f"schedule function at step {t}", kind(t)) for t in self.steps())
        else:
            if kind not in KINDS:
                raise ValueError(f"schedule kind must be one of {', '.join(KINDS)} or a function, not {kind!r}")
            if final is None:
                raise ValueError(f"schedule({kind!r}) needs final=, the sparsity it ends at")
            self.kind = kind
            self.final = _level("final sparsity", final)
            self.initial = _level("initial sparsity", initial)
            if self.initial > self.final:
                raise ValueError(f"initial sparsity {initial!r} is above final sparsity {final!r}")
            self.levels = tuple(self._formula(t) for t in self.steps())
        self.final_level = self.levels[-1]

    def _formula(self, t: int) -> float:
        """The level of a built-in kind at pruning step ``t``."""
        s_0, s_f = self.initial, self.final
        if self.kind == "constant" or t >= self.end:
            return s_f
        # torch.ao.pruning.CubicSL's expression and clamp, so the levels agree to the bit.
        progress = (t - self.start) / (self.every * self.rounds)
        if self.kind == "cubic":
            level = s_f + (s_0 - s_f) * (1.0 - progress) ** 3
        elif self.kind == "linear":
            level = s_f + (s_0 - s_f) * (1.0 - progress)
        else:  # exponential: the survivors shrink by the same factor each round
            level = 1.0 - (1.0 - s_0) * ((1.0 - s_f) / (1.0 - s_0)) ** progress
        return max(s_0, min(s_f, level))

    def steps(self) -> range:
        """The pruning steps: ``start, start + every, ..., end``."""
        return range(self.start, self.end + 1, self.every)

    def prunes_at(self, step: int) -> bool:
        """Whether ``step`` is one of the pruning steps."""
        return self.start <= step <= self.end and (step - self.start) % self.every == 0

    def __call__(self, step: int) -> float:
        """The sparsity after ``step`` training steps: the level of the latest pruning step, 0 before ``start``."""
        step = _whole("step", step, 0)
        if step < self.start:
            return 0.0
        return self.levels[min(step - self.start, self.end - self.start) // self.every]

    def description(self) -> dict[str, Any]:
        """What identifies this schedule, for checking that a saved state belongs to it (JSON-ready)."""
        levels = hashlib.sha256(repr(self.levels).encode()).hexdigest()[:16]
        return {"kind": self.kind, "start": self.start, "end": self.end, "every": self.every, "levels": levels}

    def __repr__(self) -> str:
        shape = "" if self.kind == "function" else f", initial={self.initial:g}, final={self.final:g}"
        return f"schedule({self.kind!r}{shape}, start={self.start}, end={self.end}, every={self.every})"


schedule = Schedule
"""``prunereg.schedule(kind, final=..., initial=0.0, start=0, end=..., every=1)``: builds a :class:`Schedule`."""


def _name(kind: object) -> str:
    return "function" if callable(kind) else str(kind)


def _whole(what: str, value: object, lowest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"schedule {what} must be a whole number of steps, not {type(value).__name__}")
    if value < lowest:
        raise ValueError(f"schedule {what} must be at least {lowest}, got {value}")
    return int(value)


def _level(what: str, value: object) -> float:
    return check_sparsity(value, what)
