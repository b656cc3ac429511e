"""``prunereg.GradualPruningTrainerCallback``: gradual pruning in a Hugging Face ``Trainer``, resumed from its state.

The pruner is built when the Trainer is made (``on_init_end``), so the model it
saves in a checkpoint holds the masks and the rewind point (``<name>_mask``,
``<name>_rewind``) and the same model loads them back on
``trainer.train(resume_from_checkpoint=...)``. The schedule's position is the
``TrainerState``'s ``global_step``: on resuming, the pruner stands where that
step puts it. A model that ``model_init`` makes at train time gets its pruner
then; it cannot be resumed, since the Trainer loads a checkpoint into it
(quietly leaving out the masks) before any callback runs. After each optimizer
step the pruner is told ``global_step``; at each pruning step the true sparsity
of every pruned parameter is logged once (tied parameters counted once) into
``state.log_history``, with the overall ``sparsity``.
"""

from __future__ import annotations

from typing import Any

from prunereg._gradual.pruner import GradualPruning
from prunereg._gradual.schedules import Schedule
from prunereg._gradual.settings import PrunerSettings, sparsity_log

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as error:  # the hf extra
    raise ImportError(
        "prunereg.GradualPruningTrainerCallback needs transformers: pip install 'prunereg[hf]'"
    ) from error


class GradualPruningTrainerCallback(TrainerCallback):
    """Prune on ``schedule`` with ``method`` while a ``Trainer`` trains (:class:`prunereg.GradualPruning`'s arguments).

    ``parameters`` may also be a function of the model returning the
    ``(module, name)`` pairs. ``log_sparsity=False`` logs nothing.
    """

    def __init__(self, method: str | type, schedule: Schedule, *, log_sparsity: bool = True, **settings: Any) -> None:
        self.settings = PrunerSettings.of(method, schedule, **settings)
        self.log_sparsity = log_sparsity
        self.pruner: GradualPruning | None = None
        self._model: object = None  # the model the pruner prunes

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        model = kwargs.get("model")
        if model is not None and self.pruner is None:
            self.pruner, self._model = self.settings.build(model), model

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        model = kwargs["model"]
        if model is not self._model:  # model_init made a new model for this run, or the callback came late
            if state.global_step:
                raise RuntimeError(
                    "GradualPruningTrainerCallback cannot resume a model made by model_init (or a callback added "
                    "after the Trainer was made): the Trainer loads the checkpoint into it, leaving out the masks, "
                    "before any callback runs; give Trainer(model=..., callbacks=[...]) to resume"
                )
            self.pruner, self._model = self.settings.build(model), model
        assert self.pruner is not None  # built for this model just now or when the Trainer was made
        optimizer = kwargs.get("optimizer")
        self.pruner.optimizers = [optimizer] if optimizer is not None else []
        if state.global_step:  # resumed: the model's weights brought the masks back
            self.pruner.skip_to(state.global_step)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.pruner is None:
            raise RuntimeError("GradualPruningTrainerCallback got no model from the Trainer")
        if self.pruner.step(state.global_step) and self.log_sparsity:
            state.log_history.append({**sparsity_log(self.pruner), "step": state.global_step})
