"""What recovery in shrinking's pass keeps alive, counted without RSS or timing: the bound behind its peak memory.

On SmolLM2-135M every calibration-wide set of hidden states is 38 MB, and a
second copy of every block's unchanged parameters 106 MB by the end of the
pass (docs/shrinking.md, "Peak resident memory of the whole call").
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

import prunereg
from prunereg._recover import data, shrinking
from tests.shrink.models import build, calibration_ids

transformers = pytest.importorskip("transformers")

BATCH_SIZE = 2
N_SAMPLES = 6


def _shaped(shape: torch.Size) -> list[torch.Tensor]:
    """The live floating-point tensors of ``shape``."""
    gc.collect()
    tensors = [obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor)]  # type(): no lazy getattr
    return [t for t in tensors if t.shape == shape and t.is_floating_point()]


def _storages(tensors: list[torch.Tensor]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def _sets_alive_at(
    owner: Any, name: str, removes: dict[str, float], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[float], int]:
    """Shrink with refit; at each call of ``owner.name``, how many calibration-wide sets of hidden states are alive.

    Also the model's block count. The tensors other tests left alive are kept
    referenced, so that no new tensor takes their place and is missed.
    """
    model = build("llama")
    shape = torch.Size([BATCH_SIZE, calibration_ids().shape[1], model.config.hidden_size])
    alive: list[float] = []
    original = getattr(owner, name)
    before = _shaped(shape)

    def counted(*args: Any) -> Any:
        alive.append(len(_storages(_shaped(shape)) - _storages(before)) / (N_SAMPLES // BATCH_SIZE))
        return original(*args)

    monkeypatch.setattr(owner, name, counted)
    prunereg.shrink(
        model, "flap", calibration_ids(N_SAMPLES), recover="refit", batch_size=BATCH_SIZE, progress=False, **removes
    )
    return alive, model.config.num_hidden_layers


@pytest.mark.parametrize(("removes", "sets"), [({"mlp": 0.5}, 2), ({"heads": 0.5}, 3)])
def test_when_a_block_is_handed_to_the_method_two_or_three_sets_of_hidden_states_are_alive(
    removes: dict[str, float], sets: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the block's inputs on the shrunk trajectory and the dense outputs (its targets); the dense residual after
    # attention only where the attention was cut (refit's default refits o_proj only there); not the dense inputs
    # as well, nor the dense MLP outputs the attention targets were made from
    alive, n_blocks = _sets_alive_at(shrinking, "recover_block", removes, monkeypatch)
    assert alive == [sets] * n_blocks


@pytest.mark.parametrize(("removes", "sets"), [({"mlp": 0.5}, 3), ({"heads": 0.5}, 4)])
def test_while_a_block_is_refit_at_most_three_or_four_sets_are_alive(
    removes: dict[str, float], sets: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # counted as each pass over the block, or the replay of its refit writer, measures its loss: the block's
    # inputs, its targets and its outputs (the replay's made in the place of the pass's), with the attention
    # targets where the attention was cut; not the outputs of the weights before as well, nor the rest of the
    # block's output beside them
    alive, n_blocks = _sets_alive_at(data, "_loss_of", removes, monkeypatch)
    assert len(alive) >= 2 * n_blocks  # the statistics' pass and the replay, per block
    assert max(alive) == sets


def test_the_parameters_a_recovery_left_as_they_were_are_the_originals_not_copies() -> None:
    # restore_on_error works on copies while the method runs; once it is done, the unchanged ones give way to the
    # originals the journal holds anyway, so no block keeps a second copy of them for the rest of the pass
    model = build("llama")
    attention = {name: p.data_ptr() for name, p in model.named_parameters() if ".self_attn." in name}
    report = prunereg.shrink(model, "flap", calibration_ids(), mlp=0.5, recover="refit", progress=False)
    assert all("down_proj" in note for note in [step.note for step in report.recovery.steps])
    after = {name: p.data_ptr() for name, p in model.named_parameters() if ".self_attn." in name}
    assert after == attention
