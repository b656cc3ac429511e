"""One step of recovery, wherever the blocks come from: run the method, check its changes, keep the better.

:func:`recover_block` takes one :class:`~prunereg._recover.data.RecoveryBlock`
and :func:`recover_model` a :class:`~prunereg._recover.data.RecoveryModel`;
neither walks the blocks or knows where the weights and targets came from (the
engine's loop does), so streamed recovery can call them as they are. Each
keeps a copy of what the method may change, measures the calibration objective
before and after, refuses a method that changed a shape or a pruned weight
(the copy is put back, the error names the tensor), and puts the copy back when
the method made the objective worse.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping

import torch
from torch import Tensor, nn

from prunereg._recover.contract import RecoveryMethod
from prunereg._recover.data import RecoveryBlock, RecoveryModel
from prunereg._recover.report import BlockRecovery


def recover_block(
    method: RecoveryMethod, block: RecoveryBlock, check: Callable[[RecoveryBlock], None] | None = None
) -> tuple[BlockRecovery, list[Tensor]]:
    """Recover ``block`` with ``method``: its report row, and its outputs as left (the next block's inputs).

    The objective before the method comes from the method's own first pass over
    the calibration set when it made one on the weights as they were (a refit's
    statistics); else the weights as they were are put in for one pass. Only
    the latest pass's outputs are kept: where the method made the objective
    worse and its change is undone, one more pass gives the outputs. ``check``
    runs on the block as the method left it (the ranks' agreement). Whatever
    raises, from the method to the check (another rank's failure, met in a
    pass's exchange, too), the block's parameters are put back first.
    """
    start = time.perf_counter()
    step = BlockRecovery(block.index, list(block.teacher_indices))
    copy = _run_checked(method, lambda: method.recover_block(block), block.module, block.masks, step)
    try:
        if not step.changed:  # the weights are as they came: one pass gives the loss and the outputs
            step.loss_before, outputs = block.evaluate()
            step.loss_after = step.loss_before
        else:
            loss_before = block.original_loss()
            if loss_before is None:
                with copy.swapped_in():
                    loss_before = block.evaluate()[0]
            step.loss_before = loss_before
            _keep_better(step, copy, lambda: block.evaluate()[0])
            outputs = block.evaluate()[1]  # the pass that measured the weights kept, or one more if put back
        if check is not None:
            check(block)
    except BaseException:
        copy.undo()
        raise
    step.seconds = time.perf_counter() - start
    return step, outputs


def recover_model(method: RecoveryMethod, model: RecoveryModel) -> BlockRecovery:
    """Recover the whole model with ``method``: its report row."""
    start = time.perf_counter()
    step = BlockRecovery(None)
    trainable = set(model.trainable())
    copy = _run_checked(method, lambda: method.recover_model(model), model.student, model.masks, step)
    with copy.swapped_in():
        step.loss_before = model.loss()
    touched = [name for name in step.changed if name not in trainable]
    if touched:
        copy.undo()
        raise RuntimeError(f"{method!r} changed {touched[0]}, an input embedding or the output head; put back")
    _keep_better(step, copy, model.loss)
    step.seconds = time.perf_counter() - start
    return step


def _keep_better(step: BlockRecovery, copy: _Copy, measure: Callable[[], float]) -> bool:
    """Measure the objective after a method that changed something; undo it if worse. Whether the change stays."""
    step.loss_after = step.loss_before
    if not step.changed:
        return False
    loss = measure()
    if _better(loss, step.loss_before):
        step.loss_after = loss
        return True
    copy.undo()
    step.kept_original, step.changed = True, []
    return False


class _Copy:
    """The values of some parameters before a method ran, to compare against and to put back."""

    def __init__(self, parameters: Mapping[str, nn.Parameter]) -> None:
        self.parameters = dict(parameters)
        self.values = {name: parameter.detach().clone() for name, parameter in parameters.items()}

    def changed(self) -> list[str]:
        return [name for name, parameter in self.parameters.items() if not torch.equal(parameter, self.values[name])]

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The values as they were, in the parameters for the ``with`` block, each tensor unchanged after it."""
        now = {name: parameter.data for name, parameter in self.parameters.items()}
        try:
            for name, parameter in self.parameters.items():
                parameter.data = self.values[name]
            yield
        finally:
            for name, parameter in self.parameters.items():
                parameter.data = now[name]

    def undo(self) -> None:
        with torch.no_grad():
            for name, parameter in self.parameters.items():
                value = self.values[name]
                if (parameter.shape, parameter.dtype, parameter.device) == (value.shape, value.dtype, value.device):
                    parameter.copy_(value)
                else:  # a method that broke the contract reshaped, cast or moved it
                    parameter.data = value


def _run_checked(
    method: RecoveryMethod,
    run: Callable[[], str | None],
    module: nn.Module,
    masks: Mapping[str, Tensor],
    step: BlockRecovery,
) -> _Copy:
    """Run the method with a copy of ``module``'s parameters kept; check what it left.

    Fills ``step.changed`` and ``step.note``; on any error (the method's, or
    a broken contract) the copy is put back first.
    """
    parameters = dict(module.named_parameters())
    copy = _Copy(parameters)
    layout = {name: (p.shape, p.dtype, p.device) for name, p in parameters.items()}
    try:
        note = run()
        if note is not None and not isinstance(note, str):
            raise RuntimeError(f"{method!r} returned {type(note).__name__}, not a note (str) or None")
        _check_same_parameters(method, module, parameters)
        _check_kept(method, parameters, layout, masks)
    except BaseException:
        _put_back_parameters(module, parameters)
        copy.undo()
        raise
    step.note = note or ""
    step.changed = copy.changed()
    return copy


def _check_same_parameters(method: RecoveryMethod, module: nn.Module, parameters: Mapping[str, nn.Parameter]) -> None:
    """Refuse a method that added, removed or replaced a parameter (the engine, not a method, changes structure)."""
    now = dict(module.named_parameters())
    for name in sorted(set(now) ^ set(parameters)):
        raise RuntimeError(f"{method!r} {'added' if name in now else 'removed'} the parameter {name}")
    for name, parameter in now.items():
        if parameter is not parameters[name]:
            raise RuntimeError(f"{method!r} replaced the parameter {name}; change its values in place")


def _put_back_parameters(module: nn.Module, parameters: Mapping[str, nn.Parameter]) -> None:
    """Make ``module`` hold exactly ``parameters`` again (a method that replaced, added or removed one)."""
    for name in [name for name, _ in module.named_parameters() if name not in parameters]:
        owner, _, attribute = name.rpartition(".")
        del module.get_submodule(owner)._parameters[attribute]
    for name, parameter in parameters.items():
        owner, _, attribute = name.rpartition(".")
        module.get_submodule(owner)._parameters[attribute] = parameter


def _check_kept(
    method: RecoveryMethod,
    parameters: Mapping[str, nn.Parameter],
    layout: Mapping[str, tuple[torch.Size, torch.dtype, torch.device]],
    masks: Mapping[str, Tensor],
) -> None:
    """Refuse a method that changed a parameter's shape, dtype or device, or set a pruned weight."""
    for name, parameter in parameters.items():
        if (parameter.shape, parameter.dtype, parameter.device) != layout[name]:
            raise RuntimeError(
                f"{method!r} changed {name} from {tuple(layout[name][0])} {layout[name][1]} to "
                f"{tuple(parameter.shape)} {parameter.dtype}; a recovery method keeps every shape, dtype and device"
            )
        kept = masks.get(name)
        if kept is not None and bool((parameter.detach()[~kept.to(parameter.device)] != 0).any()):
            raise RuntimeError(f"{method!r} set pruned weights of {name}; recovery must keep every zero")


def _better(after: float, before: float) -> bool:
    """Whether the objective after the method is no worse than before (a NaN never is)."""
    return math.isfinite(after) and after <= before
