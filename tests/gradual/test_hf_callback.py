"""GradualPruningTrainerCallback in a real Hugging Face Trainer.train, resumed from its checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import prunereg

pytest.importorskip("transformers")
from transformers import Trainer, TrainingArguments

from tests.support.tiny_lm import VOCAB, tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore")  # transformers' advice on tokenizers and devices


def dataset() -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, VOCAB, (16, 12), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": row, "labels": row} for row in ids]


def train(output: Path, resume: Path | None = None) -> tuple[torch.nn.Module, Trainer]:
    model = tiny_llama().train()
    schedule = prunereg.schedule("cubic", final=0.8, start=0, end=8, every=2)
    pruning = prunereg.GradualPruningTrainerCallback("l1_unstructured", schedule, rewind_to=0)
    args = TrainingArguments(
        str(output),
        max_steps=10,
        per_device_train_batch_size=4,
        save_steps=5,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=dataset(), callbacks=[pruning])
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    return model, trainer


def test_train_prunes_on_schedule_and_resumes_from_a_checkpoint_bit_for_bit(tmp_path):
    whole, trainer = train(tmp_path)
    logged = [entry for entry in trainer.state.log_history if "sparsity" in entry]
    assert [entry["step"] for entry in logged] == [2, 4, 6, 8]
    assert logged[-1]["sparsity"] == pytest.approx(0.8, abs=1e-3)
    assert len(logged[-1]) == 14 + 2  # each of the 14 Linear weights once, the whole, the step
    resumed, _ = train(tmp_path, resume=tmp_path / "checkpoint-5")  # between two pruning steps
    mine, theirs = resumed.state_dict(), whole.state_dict()
    assert mine.keys() == theirs.keys()
    assert any(name.endswith("weight_rewind") for name in mine)
    for name in theirs:
        assert torch.equal(mine[name], theirs[name]), name


def test_a_model_made_by_model_init_is_the_one_pruned_and_cannot_be_resumed_without_its_masks(tmp_path):
    made: list[torch.nn.Module] = []

    def model_init() -> torch.nn.Module:
        made.append(tiny_llama().train())
        return made[-1]

    schedule = prunereg.schedule("cubic", final=0.8, start=0, end=8, every=2)
    args = TrainingArguments(
        str(tmp_path), max_steps=10, per_device_train_batch_size=4, save_steps=5, report_to=[], use_cpu=True
    )
    pruning = prunereg.GradualPruningTrainerCallback("l1_unstructured", schedule)
    trainer = Trainer(model_init=model_init, args=args, train_dataset=dataset(), callbacks=[pruning])
    trainer.train()
    assert pruning.pruner is not None and trainer.model is made[-1]
    modules = set(made[-1].modules())
    assert all(target.module in modules for target in pruning.pruner.targets)
    assert pruning.pruner.sparsity() == pytest.approx(0.8, abs=1e-3)
    # The Trainer loads a checkpoint into model_init's new model (ignoring keys it lacks) before any callback runs.
    pruning = prunereg.GradualPruningTrainerCallback("l1_unstructured", schedule)
    trainer = Trainer(model_init=model_init, args=args, train_dataset=dataset(), callbacks=[pruning])
    with pytest.raises(RuntimeError, match="cannot resume a model made by model_init") as raised:
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-5"))
    assert "\n" not in str(raised.value)
