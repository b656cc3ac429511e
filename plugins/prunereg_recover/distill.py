"""``distill``: logit distillation of the whole model, for budgets beyond what block-wise methods use.

The student's next-token distributions are trained towards the teacher's
(:func:`prunereg.distillation_loss`: KL at a temperature, optionally mixed with
the cross-entropy on the calibration text itself) with Adam, over the
calibration batches in a seeded order, every parameter but the input
embeddings and the output head trained, until ``epochs`` passes or a budget of
seconds or tokens is spent. For a training loop of your own, or Hugging Face's
``Trainer``, the same loss is :func:`prunereg.distillation_loss` and
:class:`prunereg.DistillationTrainer`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import nn

import prunereg
from prunereg import RecoveryMethod, RecoveryModel

Callback = Callable[[int, nn.Module], None]


class Distill(RecoveryMethod):
    """Train the model on the KL divergence from the dense model's logits (Adam at ``lr``) within a budget.

    Stops after ``epochs`` passes over the calibration batches, or once
    ``max_seconds`` of training or ``max_tokens`` tokens are spent, whichever
    comes first. ``temperature`` and ``kd_ratio`` are those of
    :func:`prunereg.distillation_loss` (``kd_ratio`` below 1 mixes in the
    cross-entropy on the calibration tokens). Each batch runs ``micro_batch``
    samples at a time (their gradients summed), so the logits of only that many
    samples are alive. After each step, ``callback(tokens_seen, model)`` is
    called (its time is not counted against ``max_seconds``), and
    :attr:`curve` records ``(tokens seen, loss)`` per step: the
    tokens-to-loss curve of the run.
    """

    SCOPE = "model"

    def __init__(
        self,
        lr: float = 1e-4,
        epochs: int = 1,
        max_seconds: float | None = None,
        max_tokens: int | None = None,
        temperature: float = 1.0,
        kd_ratio: float = 1.0,
        micro_batch: int = 1,
        callback: Callback | None = None,
    ) -> None:
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
            raise ValueError(f"lr must be a number > 0, not {lr!r}")
        for name, value in (("epochs", epochs), ("micro_batch", micro_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, not {value!r}")
        for name, limit in (("max_seconds", max_seconds), ("max_tokens", max_tokens)):
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0):
                raise ValueError(f"{name} must be a number > 0 or None, not {limit!r}")
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable, not {type(callback).__name__}")
        prunereg.distillation_loss(
            torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long),
            temperature=temperature, kd_ratio=kd_ratio,
        )  # fmt: skip  # refuses a bad temperature or kd_ratio now, not after the first batch
        self.lr = float(lr)
        self.epochs = epochs
        self.max_seconds = math.inf if max_seconds is None else float(max_seconds)
        self.max_tokens = math.inf if max_tokens is None else max_tokens
        self.temperature = temperature
        self.kd_ratio = kd_ratio
        self.micro_batch = micro_batch
        self.callback = callback
        self.curve: list[tuple[int, float]] = []

    def __repr__(self) -> str:
        return f"Distill(lr={self.lr:g}, epochs={self.epochs}, temperature={self.temperature:g})"

    def recover_model(self, model: RecoveryModel) -> str | None:
        student = model.student
        trainable = model.trainable()
        flags = {name: parameter.requires_grad for name, parameter in student.named_parameters()}
        for name, parameter in student.named_parameters():
            parameter.requires_grad_(name in trainable)
        optimizer = torch.optim.Adam(list(trainable.values()), lr=self.lr)
        generator = torch.Generator().manual_seed(model.seed)
        steps = self.epochs * len(model.batches)
        tokens, seconds = 0, 0.0
        self.curve = []
        try:
            with torch.enable_grad(), prunereg.keep_zeros(student, optimizer, masks=model.masks):
                order: list[int] = []
                for _ in model.progress(range(steps), label="distill"):
                    if seconds >= self.max_seconds or tokens >= self.max_tokens:
                        break
                    if not order:
                        order = torch.randperm(len(model.batches), generator=generator).tolist()
                    ids = model.batches[order.pop()]
                    start = time.perf_counter()
                    loss = self._step(model, ids, optimizer)
                    seconds += time.perf_counter() - start
                    tokens += ids.numel()
                    self.curve.append((tokens, loss))
                    if self.callback is not None:
                        self.callback(tokens, student)
        finally:
            for name, parameter in student.named_parameters():
                parameter.requires_grad_(flags[name])
                parameter.grad = None
        return f"{len(self.curve)} Adam steps, {tokens} tokens, {seconds:.0f} s"

    def _step(self, model: RecoveryModel, ids: torch.Tensor, optimizer: torch.optim.Optimizer) -> float:
        """One optimizer step on one batch, ``micro_batch`` samples at a time; the batch's mean loss."""
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for rows in ids.split(self.micro_batch):
            with torch.no_grad():
                teacher = model.logits(rows, teacher=True)
            labels = rows if self.kd_ratio < 1 else None
            loss = prunereg.distillation_loss(
                model.logits(rows), teacher.to(rows.device), labels, temperature=self.temperature,
                kd_ratio=self.kd_ratio,
            ) * (rows.shape[0] / ids.shape[0])  # fmt: skip
            loss.backward()
            total += float(loss.detach())
        optimizer.step()
        return total
