"""``prunereg.GradualPruningCallback``: gradual pruning in a Lightning ``Trainer``, resumed from its checkpoints.

The pruner is built on the LightningModule in ``setup``, before the optimizers
and before a checkpoint is restored, so a checkpoint's masks and rewind point
load into the module's own buffers; the schedule's position is the callback's
state in the checkpoint. After each optimizer step the pruner is told
``trainer.global_step``; at each pruning step the true sparsity of every pruned
parameter is logged once (``sparsity/<name>``, tied parameters counted once) with
the overall ``sparsity``.
"""

from __future__ import annotations

from typing import Any

from prunereg._gradual.pruner import GradualPruning
from prunereg._gradual.schedules import Schedule
from prunereg._gradual.settings import PrunerSettings, sparsity_log

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError as error:  # the lightning extra
    raise ImportError("prunereg.GradualPruningCallback needs Lightning: pip install 'prunereg[lightning]'") from error


class GradualPruningCallback(Callback):
    """Prune on ``schedule`` with ``method`` while Lightning trains (:class:`prunereg.GradualPruning`'s arguments).

    ``parameters`` may also be a function of the LightningModule returning the
    ``(module, name)`` pairs. ``log_sparsity=False`` logs nothing.
    """

    def __init__(self, method: str | type, schedule: Schedule, *, log_sparsity: bool = True, **settings: Any) -> None:
        self.settings = PrunerSettings.of(method, schedule, **settings)
        self.log_sparsity = log_sparsity
        self.pruner: GradualPruning | None = None
        self._module: LightningModule | None = None  # the module the pruner prunes
        self._saved_state: dict[str, Any] | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit" and pl_module is not self._module:  # the first fit, or one of another module
            self.pruner, self._module = self.settings.build(pl_module), pl_module
            if self._saved_state is not None:
                self.pruner.load_state_dict(self._saved_state)
                self._saved_state = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._built().optimizers = list(trainer.optimizers)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        pruner = self._built()
        if pruner.step(trainer.global_step) and self.log_sparsity:
            pl_module.log_dict(sparsity_log(pruner), on_step=True, on_epoch=False)

    def state_dict(self) -> dict[str, Any]:
        return self.pruner.state_dict() if self.pruner is not None else dict(self._saved_state or {})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.pruner is not None:
            self.pruner.load_state_dict(state_dict)
        else:
            self._saved_state = state_dict

    def _built(self) -> GradualPruning:
        if self.pruner is None:
            raise RuntimeError("GradualPruningCallback trains only in Trainer.fit, which builds its pruner in setup")
        return self.pruner
