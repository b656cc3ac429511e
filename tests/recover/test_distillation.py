"""Logit distillation: the loss against its formula, the distill method's budgets, and the Trainer subclass."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import prunereg


def _manual(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor | None, t: float, ratio: float) -> float:
    """The loss written out token by token, in float64."""
    s, q = student.double().reshape(-1, student.shape[-1]), teacher.double().reshape(-1, teacher.shape[-1])
    kl_terms, ce_terms = [], []
    targets = None
    if labels is not None:
        targets = torch.cat([labels[..., 1:], torch.full_like(labels[..., :1], -100)], dim=-1).reshape(-1)
    for token in range(s.shape[0]):
        if targets is not None and int(targets[token]) == -100:
            continue
        p = torch.softmax(q[token] / t, -1)
        kl_terms.append(float((p * (torch.log(p) - torch.log_softmax(s[token] / t, -1))).sum()) * t * t)
        if targets is not None:
            ce_terms.append(-float(torch.log_softmax(s[token], -1)[targets[token]]))
    kd = sum(kl_terms) / len(kl_terms)
    return kd if labels is None or ratio == 1 else ratio * kd + (1 - ratio) * sum(ce_terms) / len(ce_terms)


@settings(max_examples=25, deadline=None)
@given(
    temperature=st.sampled_from([0.5, 1.0, 2.0, 4.0]),
    ratio=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 1000),
    with_labels=st.booleans(),
)
def test_the_loss_is_kl_at_a_temperature_mixed_with_cross_entropy(
    temperature: float, ratio: float, seed: int, with_labels: bool
) -> None:
    generator = torch.Generator().manual_seed(seed)
    student = torch.randn(2, 5, 7, generator=generator) * 3
    teacher = torch.randn(2, 5, 7, generator=generator) * 3
    labels = torch.randint(0, 7, (2, 5), generator=generator) if with_labels else None
    if labels is not None:
        labels[0, 2] = -100
    ratio = ratio if labels is not None else 1.0
    loss = prunereg.distillation_loss(student, teacher, labels, temperature=temperature, kd_ratio=ratio)
    assert math.isclose(float(loss), _manual(student, teacher, labels, temperature, ratio), rel_tol=1e-5, abs_tol=1e-6)


def test_the_loss_is_zero_for_equal_logits_and_its_gradient_reaches_only_the_student() -> None:
    student = torch.randn(3, 11, requires_grad=True)
    teacher = student.detach().clone().requires_grad_(True)
    loss = prunereg.distillation_loss(student, teacher, temperature=2.0)
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-6)
    (loss + F.mse_loss(student, student.detach() + 1)).backward()
    assert teacher.grad is None and student.grad is not None


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"temperature": 0}, ValueError, "temperature must be a number > 0"),
        ({"kd_ratio": 1.5}, ValueError, r"kd_ratio must be a number in \[0, 1\]"),
        ({"kd_ratio": 0.5}, ValueError, "pass labels"),
        ({"teacher_logits": torch.zeros(2, 4)}, ValueError, "differ in shape"),
        ({"labels": torch.zeros(3, dtype=torch.long), "kd_ratio": 0.5}, ValueError, "labels must have"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(arguments: dict, error: type, message: str) -> None:  # type: ignore[type-arg]
    call = {"student_logits": torch.zeros(2, 3), "teacher_logits": torch.zeros(2, 3), **arguments}
    with pytest.raises(error, match=message):
        prunereg.distillation_loss(**call)


transformers = pytest.importorskip("transformers")

from tests.recover.models import shrunk  # noqa: E402
from tests.shrink.models import calibration_ids, tiny_llama  # noqa: E402


def test_distill_stops_at_its_token_budget_and_records_its_curve() -> None:
    model, teacher = shrunk("llama", "wanda_sp", {"mlp": 0.5})
    seen: list[int] = []
    method = prunereg.get("distill")(epochs=50, max_tokens=100, lr=1e-3, callback=lambda tokens, _: seen.append(tokens))
    report = prunereg.recover(model, teacher, calibration_ids(), method, batch_size=2, progress=False)
    assert [tokens for tokens, _ in method.curve] == seen == [32, 64, 96, 128]
    (step,) = report.steps
    assert step.index is None and step.loss_after <= step.loss_before
    assert "4 Adam steps, 128 tokens" in step.note
    embeddings = [name for name in step.changed if "embed_tokens" in name or "lm_head" in name]
    assert embeddings == []
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


def test_distill_lowers_the_kl_divergence_from_the_teacher() -> None:
    model = tiny_llama(layers=2, initializer_range=0.1)
    teacher = copy.deepcopy(model)
    prunereg.shrink(model, "wanda_sp", calibration_ids(), mlp=0.5, progress=False)
    report = prunereg.recover(model, teacher, calibration_ids(), "distill", epochs=10, lr=1e-3, progress=False)
    (step,) = report.steps
    assert not step.kept_original and step.loss_after < 0.9 * step.loss_before


def test_the_distillation_trainer_trains_towards_the_teacher_and_keeps_zeros(tmp_path: Path) -> None:
    model, teacher = shrunk("llama", "wanda_sp", {"mlp": 0.5})
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[:, :3] = 0
    zero = model.model.layers[0].mlp.down_proj.weight == 0
    ids = calibration_ids(8, 12)
    data = [{"input_ids": row, "labels": row} for row in ids]
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, learning_rate=1e-2, weight_decay=0.1,
        report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
    )  # fmt: skip
    trainer = prunereg.DistillationTrainer(
        model=model, teacher=teacher, args=arguments, train_dataset=data, temperature=2.0, kd_ratio=0.5
    )
    before = copy.deepcopy(model.state_dict())
    trainer.train()
    weight = model.model.layers[0].mlp.down_proj.weight
    assert bool((weight[zero] == 0).all())
    assert not torch.equal(weight, before["model.layers.0.mlp.down_proj.weight"])
    with torch.no_grad():
        loss = trainer.compute_loss(model, {"input_ids": ids[:2], "labels": ids[:2]})
    assert math.isfinite(float(loss))
