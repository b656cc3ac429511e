"""A Hugging Face ``Trainer`` that distils a teacher into the model it trains, keeping a pruned model's zeros.

Imported only when ``prunereg.DistillationTrainer`` is first used: it needs transformers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import Trainer, TrainerCallback

from prunereg._recover.distillation import ZeroKeeper, distillation_loss
from prunereg._recover.distillation import keep_zeros as zero_keeper


class _ZerosAfterSteps(TrainerCallback):
    """Zero the pruned weights again after every optimizer step (weight decay, momentum)."""

    def __init__(self, keeper: ZeroKeeper) -> None:
        self.keeper = keeper

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.keeper.apply()


class DistillationTrainer(Trainer):
    """``transformers.Trainer`` with a teacher: the loss is :func:`prunereg.distillation_loss` of both models' logits.

    ``DistillationTrainer(model=student, teacher=dense, args=..., train_dataset=...)``
    takes every ``Trainer`` argument, plus ``teacher`` (the model before
    shrinking or pruning, run without gradients, moved to the model's device),
    ``temperature`` and ``kd_ratio`` (the share of the KL term; the rest is the
    cross-entropy on the batch's ``labels``; without labels the loss is the KL
    term alone). ``keep_zeros=True`` (the default) keeps every zero of a pruned
    model zero: their gradients are zeroed and, after each optimizer step, the
    weights too.
    """

    loss_is_scaled_for_ga = False  # the loss is a mean over the batch's tokens: the Trainer divides it for accumulation

    def __init__(
        self,
        *args: Any,
        teacher: nn.Module,
        temperature: float = 1.0,
        kd_ratio: float = 0.5,
        keep_zeros: bool = True,
        **kwargs: Any,
    ) -> None:
        if not isinstance(teacher, nn.Module):
            raise TypeError(f"teacher must be a torch.nn.Module, not {type(teacher).__name__}")
        distillation_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long),
                          temperature=temperature, kd_ratio=kd_ratio)  # fmt: skip  # checks them now
        super().__init__(*args, **kwargs)
        self.model_accepts_loss_kwargs = False  # the model gets no num_items_in_batch: the loss is computed here
        self.teacher = teacher.to(self.args.device).eval()
        self.temperature = temperature
        self.kd_ratio = kd_ratio
        self.zeros: ZeroKeeper | None = None
        if keep_zeros:
            assert isinstance(self.model, nn.Module)
            self.zeros = zero_keeper(self.model)
            self.add_callback(_ZerosAfterSteps(self.zeros))

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        """The distillation loss of ``model``'s logits against the teacher's on the same inputs."""
        labels = inputs.get("labels")
        model_inputs = {key: value for key, value in inputs.items() if key != "labels"}
        outputs = model(**model_inputs)
        with torch.no_grad():
            teacher_logits = self.teacher(**model_inputs).logits
        kd_ratio = self.kd_ratio if labels is not None else 1.0
        loss = distillation_loss(
            outputs.logits, teacher_logits, labels, temperature=self.temperature, kd_ratio=kd_ratio
        )
        return (loss, outputs) if return_outputs else loss
