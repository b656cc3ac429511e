"""Calibrated methods (``wanda``, ``magnitude``, third-party ones) on schedule, from calibration batches.

At each pruning step the calibration batches run through the model with hooks
on the pruned Linear layers that gather the statistics the method asks for
(the runtime's recorder, as in one-shot pruning), then each layer is pruned by the method at the
scheduled sparsity, as one-shot pruning prunes it. Weights pruned earlier are
handed over as NaN, which every calibrated method prunes first (prunereg's NaN
rule), so they stay pruned; a method that ignores that rule is caught.
Methods that rewrite the weights they keep (``sparsegpt``) are refused:
during training, the optimizer owns the weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from prunereg._distributed.counts import pruned_entries
from prunereg._gradual.masks import Target
from prunereg._oneshot.contract import SITE, CalibratedMethod, LayerStatistics, layer_statistics
from prunereg._runtime.mode import calibration_mode
from prunereg._runtime.recorder import Recorder
from prunereg._runtime.registry import at_site


class CalibratedPlan:
    """How a calibrated method prunes the targets at a level, from ``calibration`` batches run through ``model``."""

    def __init__(
        self,
        method: type[CalibratedMethod],
        name: str,
        options: dict[str, Any],
        *,
        model: nn.Module | None,
        calibration: Iterable[Any] | None,
        levels: Sequence[float],
        monotone: bool,
    ) -> None:
        if method.UPDATES_WEIGHTS:
            raise ValueError(
                f"method {name!r} rewrites the weights it keeps, which training does during gradual pruning: "
                "use a calibrated method that only masks (wanda, magnitude)"
            )
        for level in sorted(set(levels)):
            method(sparsity=level, **options)  # its own checks (a pattern fits one sparsity only), before training
        if method.STATISTICS:
            if model is None:
                raise ValueError(f"method {name!r} runs the model on calibration batches: give the model, not a list")
            if calibration is None:
                raise ValueError(f"method {name!r} needs calibration= batches of model inputs (a list or a DataLoader)")
            if iter(calibration) is calibration:  # an iterator: one pass only
                raise TypeError("calibration must be read again at every pruning step: a list or a DataLoader")
        self.method = method
        self.name = name
        self.options = options
        self.model = model
        self.calibration = calibration
        self.monotone = monotone

    def check_targets(self, found: Sequence[Target]) -> None:
        """Refuse targets the method cannot prune: statistics are gathered on Linear layers' inputs."""
        for target in found:
            if target.orig().dim() < 2:
                raise ValueError(f"method {self.name!r} prunes matrices, and {target.label} is a vector")
            if self.method.STATISTICS and not (isinstance(target.module, nn.Linear) and target.attribute == "weight"):
                raise ValueError(f"method {self.name!r} gathers Linear inputs, and {target.label} is no Linear weight")

    def masks(self, found: Sequence[Target], level: float) -> list[torch.Tensor]:
        """Each target's mask at ``level``, as the method chooses it (its own rule for counting the share)."""
        statistics = self._statistics(found) if self.method.STATISTICS else {}
        method = self.method(sparsity=level, **self.options)
        masks = []
        for target in found:
            orig, mask = target.orig().detach(), target.mask().detach()
            weight = orig.to(torch.float32).reshape(orig.shape[0], -1)
            if self.monotone:
                weight = weight.masked_fill(mask.reshape(weight.shape) == 0, float("nan"))
            stats = statistics.get(target.label, LayerStatistics(n_tokens=0))
            [result] = method.prune_group([weight], stats, [level])
            new = result.mask.reshape(orig.shape).to(device=mask.device, dtype=mask.dtype)
            if self.monotone and bool(((mask == 0) & (new != 0)).any()):
                self._refuse_regrowth(target, level, pruned_entries(mask), pruned_entries(new))
            masks.append(new)
        return masks

    def _refuse_regrowth(self, target: Target, level: float, before: int, now: int) -> None:
        """The error for a mask that keeps weights pruned earlier: the level is too low, or the method ignores NaN."""
        if now < before:
            raise ValueError(
                f"{target.label} has {before} weights pruned already, and {self.name!r} at sparsity {level:g} prunes "
                f"{now}: a monotone method never restores them (start the schedule at or above what is pruned)"
            )
        raise RuntimeError(
            f"method {self.name!r} kept weights of {target.label} pruned earlier (given as NaN, which "
            "prunereg's methods prune first): set MONOTONE = False on its class if it lets weights regrow"
        )

    def _statistics(self, found: Sequence[Target]) -> dict[str, LayerStatistics]:
        assert self.model is not None and self.calibration is not None  # checked when built
        layers = {target.label: target.module for target in found}
        recorder = Recorder(at_site(self.method.STATISTICS, SITE), layers=layers)
        with recorder, calibration_mode(self.model):
            for index, batch in enumerate(self.calibration):
                with recorder.batch(index):
                    _run(self.model, batch)
        return {
            name: layer_statistics(n_tokens, results)
            for names, n_tokens, results in recorder.group_results()
            for name in names
        }


def _run(model: nn.Module, batch: Any) -> None:
    if isinstance(batch, Mapping):
        model(**batch)
    elif isinstance(batch, (tuple, list)):
        model(*batch)
    else:
        model(batch)
