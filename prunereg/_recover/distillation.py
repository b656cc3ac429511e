"""Logit distillation for the user's own training loop: the loss, and keeping a pruned model's zeros.

:func:`distillation_loss` mixes the KL divergence of the student's
next-token distributions from the teacher's, at a temperature, with the usual
cross-entropy on the labels (Hinton et al.; NeMo's ``kd_ratio``).
:func:`keep_zeros` makes training leave every zero of a pruned (masked) model
zero: the gradients of pruned weights are zeroed, and after each optimizer step
the pruned weights are zeroed again (an optimizer with momentum or weight decay
would otherwise move them).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from prunereg._recover.data import apply_zero_masks, zero_masks


def distillation_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor | None = None,
    *,
    temperature: float = 1.0,
    kd_ratio: float = 1.0,
    ignore_index: int = -100,
) -> Tensor:
    """``kd_ratio * T^2 * KL(teacher || student) + (1 - kd_ratio) * CE(student, labels)`` over the tokens.

    ``student_logits`` and ``teacher_logits`` are ``[..., vocabulary]`` (a causal
    LM's ``.logits``); ``labels`` are token ids laid out like the logits' leading
    dims, as Hugging Face causal LMs take them: the logits at position ``t``
    predict ``labels[t + 1]`` (shifted here), and positions whose label is
    ``ignore_index`` count in neither term. Without labels ``kd_ratio`` must be 1.
    The KL term is the mean over tokens of the sum over the vocabulary, scaled
    by ``T^2`` so that its gradients keep their size across temperatures.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student and teacher logits differ in shape: {tuple(student_logits.shape)} and "
            f"{tuple(teacher_logits.shape)}"
        )
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, not {temperature!r}")
    if isinstance(kd_ratio, bool) or not isinstance(kd_ratio, (int, float)) or not 0 <= kd_ratio <= 1:
        raise ValueError(f"kd_ratio must be a number in [0, 1], not {kd_ratio!r}")
    vocabulary = student_logits.shape[-1]
    student = student_logits.reshape(-1, vocabulary).float()
    teacher = teacher_logits.reshape(-1, vocabulary).detach().float()
    weights = None
    if labels is None:
        if kd_ratio != 1:
            raise ValueError("kd_ratio below 1 mixes in the cross-entropy on labels; pass labels")
    else:
        if tuple(labels.shape) != tuple(student_logits.shape[:-1]):
            raise ValueError(
                f"labels must have the logits' leading shape {tuple(student_logits.shape[:-1])}, "
                f"not {tuple(labels.shape)}"
            )
        shifted = torch.full_like(labels, ignore_index)
        shifted[..., :-1] = labels[..., 1:]
        targets = shifted.reshape(-1)
        weights = (targets != ignore_index).float()
    kd = _kl(student, teacher, float(temperature), weights) * float(temperature) ** 2
    if labels is None or kd_ratio == 1:
        return kd
    assert weights is not None
    ce = F.cross_entropy(student, targets, ignore_index=ignore_index, reduction="sum") / weights.sum().clamp(min=1)
    return kd_ratio * kd + (1 - kd_ratio) * ce


def _kl(student: Tensor, teacher: Tensor, temperature: float, weights: Tensor | None) -> Tensor:
    """The mean over tokens (those of weight 1) of KL(softmax(teacher / T) || softmax(student / T))."""
    log_q = F.log_softmax(student / temperature, dim=-1)
    log_p = F.log_softmax(teacher / temperature, dim=-1)
    per_token = (log_p.exp() * (log_p - log_q)).sum(-1)
    if weights is None:
        return per_token.mean()
    return (per_token * weights).sum() / weights.sum().clamp(min=1)


class ZeroKeeper(AbstractContextManager["ZeroKeeper"]):
    """What :func:`keep_zeros` installed: gradient hooks on the pruned parameters, perhaps an optimizer hook.

    :meth:`apply` zeroes the pruned weights again; :meth:`remove` (or leaving
    the ``with`` block) takes the hooks off.
    """

    def __init__(self, model: nn.Module, masks: dict[str, Tensor], optimizer: Any = None) -> None:
        self.model = model
        self.masks = masks
        self._handles: list[Any] = []
        for name, kept in masks.items():
            parameter = model.get_parameter(name)
            if parameter.requires_grad:  # a frozen one gets no gradient to mask
                mask = kept.to(parameter.device)
                self._handles.append(parameter.register_hook(lambda grad, mask=mask: grad * mask))
        if optimizer is not None:
            self._handles.append(optimizer.register_step_post_hook(lambda *_: self.apply()))

    def apply(self) -> None:
        """Zero every pruned weight again."""
        apply_zero_masks(self.model, self.masks)

    def remove(self) -> None:
        """Take the hooks off (the zeros stay as they are)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __iter__(self) -> Iterator[str]:
        return iter(self.masks)


def keep_zeros(model: nn.Module, optimizer: Any = None, masks: Mapping[str, Tensor] | None = None) -> ZeroKeeper:
    """Make training keep every exact zero of ``model``'s weights (a pruned model's) zero.

    Each parameter of two dims or more that holds zeros and requires a
    gradient gets a hook that zeroes their gradients; with ``optimizer`` (a ``torch.optim``
    optimizer) the pruned weights are also zeroed again after each of its
    steps, else call :meth:`ZeroKeeper.apply` after each step. Use it as a
    context manager, or call :meth:`ZeroKeeper.remove`, to take the hooks off.
    ``masks`` (by parameter name, True where kept) names the pruned entries
    instead: a recovery method passes its block's ``masks``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    return ZeroKeeper(model, zero_masks(model, share=0.0) if masks is None else dict(masks), optimizer)
