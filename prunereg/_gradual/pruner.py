"""``prunereg.GradualPruning``: prune on a schedule during training, with rewinding and a state to resume from.

One call per training step (``pruner.step()`` after ``optimizer.step()``); at
the schedule's pruning steps every target's mask is replaced, in place, by
one that prunes exactly the scheduled share (:mod:`.selection`,
:mod:`.calibrated`), and with ``rewind_to=k`` the kept weights go back to
their values at step k (:mod:`.rewind`). Everything shaped like a weight (the
masks, the rewind point) lives in the model, so any checkpoint of the model
holds it; :meth:`GradualPruning.state_dict` holds where the schedule stands.
"""

from __future__ import annotations

import contextlib
import itertools
import numbers
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from prunereg._core import reparam
from prunereg._core import tied as _tied
from prunereg._core.method import BasePruningMethod
from prunereg._gradual import masks as _masks
from prunereg._gradual import rewind as _rewind
from prunereg._gradual.calibrated import CalibratedPlan
from prunereg._gradual.schedules import Schedule
from prunereg._gradual.selection import MaskMethodPlan
from prunereg._oneshot.contract import CalibratedMethod
from prunereg._plugins.kinds import kind
from prunereg._plugins.loading import registry

STATE_FORMAT = 1


class GradualPruning:
    """Prune ``model``'s parameters (or the ``(module, name)`` pairs given) with ``method`` on ``schedule``.

    ``method``: a registered name or class, unstructured or structured (built as
    ``method(amount=<count>, **method_options)``, e.g. ``n=2, dim=0`` for
    ``ln_structured``), or calibrated (``wanda``, ``magnitude``; ``calibration=``
    batches of model inputs, a list or a DataLoader, where it reads activations).
    ``parameters``: the ``(module, name)`` pairs of ``model`` to prune; by default
    :func:`prunereg.parameters_to_prune`'s. ``globally=True`` prunes them as one
    (an unstructured method). ``rewind_to=k`` rewinds the kept weights to their
    values after k training steps (0: before training) after each pruning step
    past k, resetting the optimizer's state of those parameters when
    ``optimizer_state="reset"`` (``optimizer=`` then names it) or keeping it.

    ``state=``: a :meth:`state_dict` to continue from, for a model that was
    saved whole mid-schedule (``torch.save``, ``copy.deepcopy``) and holds its
    masks and rewind point; a model rebuilt from scratch takes its state dict
    and the pruner's :meth:`load_state_dict` after this is built.

    Everything is checked before this returns (the schedule against the method,
    and a dry run of the method at the first sparsity that prunes and at the
    final one, drawing no random numbers); on an error the model is as it was.
    Then the parameters are reparametrized with one mask each, and pruned if
    step 0 is a pruning step.
    """

    def __init__(
        self,
        model: nn.Module | Iterable[tuple[nn.Module, str]],
        method: str | type,
        schedule: Schedule,
        *,
        parameters: Iterable[tuple[nn.Module, str]] | None = None,
        globally: bool = False,
        calibration: Iterable[Any] | None = None,
        rewind_to: int | None = None,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        optimizer_state: str = "keep",
        state: dict[str, Any] | None = None,
        **method_options: Any,
    ) -> None:
        if not isinstance(schedule, Schedule):
            raise TypeError(f"schedule must come from prunereg.schedule(...), not {type(schedule).__name__}")
        self.schedule = schedule
        self.method_name = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
        method_class = registry().resolve(method) if isinstance(method, str) else method
        self.monotone = bool(getattr(method_class, "MONOTONE", True))
        if self.monotone:
            _check_never_decreases(schedule, self.method_name)
        self.rewind_to = _check_rewind(rewind_to, schedule, optimizer_state, optimizer)
        self.optimizer_state = optimizer_state
        self.optimizers: list[torch.optim.Optimizer] = _optimizer_list(optimizer)
        self.globally = globally
        self.targets = _masks.targets(model, parameters)
        if state is not None:
            self._check_state(state)
        self.plan = _plan(
            method_class,
            self.method_name,
            method_options,
            model=model if isinstance(model, nn.Module) else None,
            calibration=calibration,
            globally=globally,
            schedule=schedule,
            monotone=self.monotone,
        )
        with reparam.all_or_nothing([tensor for target in self.targets for tensor in target.tensors()]):
            self.targets = _masks.install(self.targets, method_class)
            if isinstance(self.plan, CalibratedPlan):
                self.plan.check_targets(self.targets)
            else:
                with _no_draws(self.targets):  # the dry run: a method that cannot reach a level fails now
                    for level in _dry_run_levels(schedule, after=None if state is None else state["steps_done"]):
                        self.plan.masks(self.targets, level)
            if self.rewind_to is not None:
                _rewind.prepare(self.targets)
        self.steps_done = 0
        self.level = 0.0
        self.rewind_captured = False
        self.finished = False  # by finish(): no more steps
        self.permanent = False  # by finish(permanent=True): no more masks
        if state is None:
            self._advance(0)
        else:
            self.load_state_dict(state)

    def step(self, step: int | None = None) -> bool:
        """Count one more training step (or say how many are done: ``step``); prune if the schedule says so.

        Returns whether the masks were recomputed. The step already done again
        does nothing (a trainer asks after every batch of an accumulation); a step
        number that went back, or that jumps over ``rewind_to`` before the rewind
        point was saved, is a ValueError.
        """
        self._check_not_finished()
        if step is None:
            step = self.steps_done + 1
        elif isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < self.steps_done:
            raise ValueError(
                f"step must be a whole number of at least {self.steps_done} (the steps done), not {step!r}"
            )
        if step == self.steps_done:
            return False
        if self.rewind_to is not None and not self.rewind_captured and self.steps_done < self.rewind_to < step:
            raise ValueError(
                f"step jumps from step {self.steps_done} to step {step} over rewind_to={self.rewind_to}: the "
                f"weights after {self.rewind_to} steps would never be saved; call step({self.rewind_to}) first"
            )
        self.steps_done = int(step)
        return self._advance(self.steps_done)

    def skip_to(self, step: int) -> None:
        """Stand at ``step`` as if this pruner had stepped there, without pruning or rewinding.

        For a resume whose masks and rewind point came back with the model's
        weights and whose step count is all that was kept (a Hugging Face
        ``TrainerState``): the level is the schedule's at ``step``.
        """
        self.steps_done = int(step)
        self.level = self.schedule(step)
        self.rewind_captured = self.rewind_to is not None and step >= self.rewind_to

    def _advance(self, step: int) -> bool:
        if step == self.rewind_to:
            _rewind.capture(self.targets)
            self.rewind_captured = True
        if step < self.schedule.start:
            return False
        level = self.schedule(step)
        if level == self.level and (self.monotone or not self.schedule.prunes_at(step)):
            return False
        for target, mask in zip(self.targets, self.plan.masks(self.targets, level)):
            _masks.write(target, mask)
        self.level = level
        if self.rewind_captured and self.rewind_to is not None and step > self.rewind_to:
            _rewind.rewind(self.targets, self.optimizers, self.optimizer_state)
        return True

    def sparsities(self) -> dict[str, float]:
        """Each pruned parameter's true sparsity (the share of zeros in its mask), once per parameter, tied or not."""
        self._check_masks_held()
        return {target.label: target.sparsity() for target in self.targets}

    def sparsity(self) -> float:
        """The share of zeros over all the pruned parameters together."""
        self._check_masks_held()
        return sum(target.pruned() for target in self.targets) / sum(t.mask().numel() for t in self.targets)

    def state_dict(self) -> dict[str, Any]:
        """Where the schedule stands (the masks and the rewind point are in the model's own state dict)."""
        return {
            "format": STATE_FORMAT,
            "steps_done": self.steps_done,
            "level": self.level,
            "rewind_captured": self.rewind_captured,
            "identity": self._identity(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; refused (ValueError) when it was saved with another schedule or method.

        Load the model's state dict (masks, rewind point) too; this pruner then
        takes the same next step as the one that saved the state.
        """
        self._check_state(state)
        self.steps_done = int(state["steps_done"])
        self.level = float(state["level"])
        self.rewind_captured = bool(state["rewind_captured"])

    def _check_state(self, state: object) -> None:
        """A ValueError unless ``state`` is a :meth:`state_dict` of a pruner built as this one."""
        what = f"not a GradualPruning state of format {STATE_FORMAT}"
        if not isinstance(state, dict):
            raise ValueError(f"{what}: a {type(state).__name__}")
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"{what}: format {state.get('format')!r}")
        missing = sorted({"steps_done", "level", "rewind_captured", "identity"} - set(state))
        if missing:
            raise ValueError(f"{what}: it lacks {', '.join(missing)}")
        saved, mine = state["identity"], self._identity()
        differ = [key for key in mine if saved.get(key) != mine[key]] if isinstance(saved, dict) else list(mine)
        if differ:
            raise ValueError(
                f"the state was saved by another pruner: its {', '.join(differ)} "
                f"differ{'s' if len(differ) == 1 else ''}; build this one as that one was built"
            )

    def _identity(self) -> dict[str, Any]:
        return {
            "method": self.method_name,
            "globally": self.globally,
            "rewind_to": self.rewind_to,
            "schedule": self.schedule.description(),
            "parameters": [target.label for target in self.targets],
        }

    def finish(self, *, permanent: bool = True) -> None:
        """End the schedule: drop the rewind point and, if ``permanent``, make the pruning permanent.

        Permanent: plain parameters holding zeros (a parameter already made
        permanent by hand is left as it is). Calling it again does what is
        left to do; a finished pruner takes no more steps.
        """
        self.finished = True
        _rewind.remove(self.targets)
        if permanent and not self.permanent:
            for target in self.targets:
                if target.is_pruned():
                    _tied.remove(target.root, target.name)
            self.permanent = True

    def _check_not_finished(self) -> None:
        if self.finished:
            raise RuntimeError("this GradualPruning is finished: build a new one to prune again")

    def _check_masks_held(self) -> None:
        if self.permanent:
            raise RuntimeError("this GradualPruning is finished and its masks are gone: count zeros in the weights")

    def __repr__(self) -> str:
        return (
            f"GradualPruning({self.method_name!r}, {self.schedule!r}, {len(self.targets)} parameters, "
            f"step {self.steps_done}, sparsity {self.level:g})"
        )


def _check_never_decreases(schedule: Schedule, method: str) -> None:
    pruning = list(zip(schedule.steps(), schedule.levels))
    for (step, level), (next_step, next_level) in itertools.pairwise(pruning):
        if next_level < level:
            raise ValueError(
                f"the schedule goes down from {level:g} at step {step} to {next_level:g} at step {next_step}, "
                f"and {method!r} never restores a pruned weight"
            )


def _check_rewind(rewind_to: object, schedule: Schedule, optimizer_state: str, optimizer: object) -> int | None:
    if optimizer_state not in _rewind.OPTIMIZER_STATES:
        raise ValueError(
            f"optimizer_state must be one of {', '.join(_rewind.OPTIMIZER_STATES)}, not {optimizer_state!r}"
        )
    if rewind_to is None:
        return None
    if isinstance(rewind_to, bool) or not isinstance(rewind_to, numbers.Integral) or rewind_to < 0:
        raise ValueError(f"rewind_to must be a step number of at least 0, not {rewind_to!r}")
    if int(rewind_to) >= schedule.end:
        raise ValueError(
            f"rewind_to={rewind_to} is not before the schedule's last pruning step {schedule.end}: "
            "no pruning step would rewind to it"
        )
    if optimizer_state == "reset" and optimizer is None:
        raise ValueError('optimizer_state="reset" needs optimizer=, the optimizer whose state to reset')
    return int(rewind_to)


def _plan(
    method: type,
    name: str,
    options: dict[str, Any],
    *,
    model: nn.Module | None,
    calibration: Iterable[Any] | None,
    globally: bool,
    schedule: Schedule,
    monotone: bool,
) -> MaskMethodPlan | CalibratedPlan:
    """How ``method`` chooses the masks: a calibrated method from ``calibration`` batches, a mask method by amount."""
    if isinstance(method, type) and issubclass(method, CalibratedMethod):
        if globally:
            raise TypeError(f"globally=True needs an unstructured method, and {name!r} is calibrated")
        _check_not_given(options, "sparsity", name)
        return CalibratedPlan(
            method, name, options, model=model, calibration=calibration, levels=schedule.levels, monotone=monotone
        )
    if isinstance(method, type) and issubclass(method, BasePruningMethod):
        if calibration is not None:
            raise ValueError(f"method {name!r} reads no calibration batches: leave calibration= out")
        _check_not_given(options, "amount", name)
        return MaskMethodPlan(method, name, options, globally=globally, monotone=monotone)
    with contextlib.suppress(LookupError):  # a registered method of another kind: say what it is for
        registered = registry().info(name).kind
        raise TypeError(
            f"method {name!r} is a {registered} method (it runs with {kind(registered).runs_with}): "
            "gradual pruning takes an unstructured, structured or calibrated one"
        )
    raise TypeError(f"method must be a registered name or a pruning-method class, not {method!r}")


def _check_not_given(options: dict[str, Any], share: str, name: str) -> None:
    """Refuse the option through which the method is told its share: the schedule tells it."""
    if share in options:
        raise TypeError(f"the schedule gives {name!r} its {share}: leave {share}= out")


def _dry_run_levels(schedule: Schedule, *, after: int | None) -> list[float]:
    """The levels a dry run tries: the first one still to prune (weights pruned before may exceed it) and the last.

    ``after``: the steps done by a pruner resumed from its state; only later pruning steps are still to come.
    """
    pending = [level for step, level in zip(schedule.steps(), schedule.levels) if after is None or step > after]
    first = next((level for level in pending if level > 0), schedule.final_level)
    return sorted({first, schedule.final_level})


def _optimizer_list(optimizer: object) -> list[torch.optim.Optimizer]:
    if optimizer is None:
        return []
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    return list(optimizer)  # type: ignore[call-overload]  # a sequence of optimizers


def _no_draws(found: Sequence[_masks.Target]) -> AbstractContextManager[None]:
    """A block that leaves the random generators as it found them: the CPU's and those of the targets' devices."""
    devices = {target.orig().device for target in found} - {torch.device("cpu"), torch.device("meta")}
    kinds = {device.type for device in devices}
    return torch.random.fork_rng(
        devices=sorted(devices, key=str), device_type=kinds.pop() if len(kinds) == 1 else "cuda"
    )
