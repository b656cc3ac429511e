"""What the trainer callbacks share: the arguments of the :class:`GradualPruning` they build, and what they log."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from prunereg._gradual.pruner import GradualPruning
from prunereg._gradual.rewind import OPTIMIZER_STATES
from prunereg._gradual.schedules import Schedule

Pairs = Iterable[tuple[nn.Module, str]]


@dataclass
class PrunerSettings:
    """``GradualPruning``'s arguments but the model; ``parameters`` may be a function of the model."""

    method: str | type
    schedule: Schedule
    parameters: Pairs | Callable[[nn.Module], Pairs] | None = None
    globally: bool = False
    calibration: Iterable[Any] | None = None
    rewind_to: int | None = None
    optimizer_state: str = "keep"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # What can be checked without the model is checked when the callback is made.
        if not isinstance(self.schedule, Schedule):
            raise TypeError(f"schedule must come from prunereg.schedule(...), not {type(self.schedule).__name__}")
        if self.optimizer_state not in OPTIMIZER_STATES:
            raise ValueError(
                f"optimizer_state must be one of {', '.join(OPTIMIZER_STATES)}, not {self.optimizer_state!r}"
            )

    @classmethod
    def of(
        cls,
        method: str | type,
        schedule: Schedule,
        *,
        parameters: Pairs | Callable[[nn.Module], Pairs] | None = None,
        globally: bool = False,
        calibration: Iterable[Any] | None = None,
        rewind_to: int | None = None,
        optimizer_state: str = "keep",
        **options: Any,
    ) -> PrunerSettings:
        """The settings from ``GradualPruning``'s keyword arguments (the method's options last)."""
        return cls(method, schedule, parameters, globally, calibration, rewind_to, optimizer_state, options)

    def build(self, model: nn.Module) -> GradualPruning:
        """The pruner of ``model``; the trainer's optimizers are handed to it (``optimizers``) once they exist."""
        parameters = self.parameters(model) if callable(self.parameters) else self.parameters
        return GradualPruning(
            model,
            self.method,
            self.schedule,
            parameters=parameters,
            globally=self.globally,
            calibration=self.calibration,
            rewind_to=self.rewind_to,
            optimizer=(),
            optimizer_state=self.optimizer_state,
            **self.options,
        )


def sparsity_log(pruner: GradualPruning) -> dict[str, float]:
    """What a callback logs at a pruning step: ``sparsity/<name>`` of each parameter (once, tied or not), the whole."""
    logged = {f"sparsity/{label}": value for label, value in pruner.sparsities().items()}
    logged["sparsity"] = pruner.sparsity()
    return logged
