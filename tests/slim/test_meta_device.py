"""A model on the meta device (shapes, no values) slims by an importance that needs no values, to the shapes,
parameters and MACs the same model with values gets; what needs values is refused in one line, the model unchanged."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import prunereg
from tests.slim.helpers import assert_unchanged, exact_state
from tests.support import slim_models


def _on_meta(build: Callable[[int], slim_models.Built]) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model ``build`` makes, built again on the meta device, and its example inputs there."""
    with torch.device("meta"):
        model, inputs = build(0)
    return model, tuple(torch.empty_like(t, device="meta") for t in inputs)


def _hf_llama(seed: int = 0) -> slim_models.Built:
    model, inputs = slim_models.hf_smollm2_llama(seed)
    return type(model)(copy.deepcopy(model.config)).eval(), inputs  # built afresh: under torch.device("meta") too


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    return {name: tuple(tensor.shape) for name, tensor in tensors}


MODELS: dict[str, Callable[[int], slim_models.Built]] = {
    "conv, batch norm, depthwise conv, concat, residual": slim_models.concat_depthwise_residual_cnn,
    "multi-head attention": slim_models.attention_block,
    "flatten into a linear": slim_models.lenet,
}


@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_a_meta_model_slims_by_random_to_the_shapes_and_report_of_the_model_with_values(
    build: Callable[[int], slim_models.Built],
) -> None:
    model, inputs = build(0)
    meta, meta_inputs = _on_meta(build)
    torch.manual_seed(7)
    expected = prunereg.slim(model, inputs, ratio=0.5, importance="random")
    torch.manual_seed(7)  # random's draws do not depend on the values: the same channels go
    report = prunereg.slim(meta, meta_inputs, ratio=0.5, importance="random")
    assert report.as_dict() == expected.as_dict() and report.removed > 0
    assert _shapes(meta) == _shapes(model)
    assert all(t.is_meta for t in [*meta.parameters(), *meta.buffers()])
    assert slim_models.output_shapes(meta, meta_inputs) == slim_models.output_shapes(model, inputs)


def test_a_meta_hugging_face_model_slims_though_its_code_asks_for_values_and_records_its_shapes() -> None:
    pytest.importorskip("transformers")
    model, inputs = _hf_llama()
    meta, meta_inputs = _on_meta(_hf_llama)
    torch.manual_seed(3)
    expected = prunereg.slim(model, inputs, ratio=0.5, importance="random")
    torch.manual_seed(3)
    report = prunereg.slim(meta, meta_inputs, ratio=0.5, importance="random")
    assert _shapes(meta) == _shapes(model)
    # the config can only be checked against outputs, which a meta model has none of: it records the shapes
    assert not report.config_rewritten and meta.config.prunereg_slimmed["tensors"]
    assert {**report.as_dict(), "config_rewritten": True} == expected.as_dict()


class ByPosition(prunereg.Importance):
    """Scores that need no values: the first units of every group are kept."""

    def __call__(self, group: Any, values: Any) -> torch.Tensor:
        return torch.arange(group.size, 0, -1, dtype=torch.float64)


def test_an_importance_of_ones_own_that_needs_no_values_slims_a_meta_model_as_the_model_with_values() -> None:
    model, inputs = slim_models.concat_depthwise_residual_cnn(0)
    meta, meta_inputs = _on_meta(slim_models.concat_depthwise_residual_cnn)
    expected = prunereg.slim(model, inputs, ratio=0.25, importance=ByPosition())
    assert prunereg.slim(meta, meta_inputs, ratio=0.25, importance=ByPosition()).as_dict() == expected.as_dict()
    assert _shapes(meta) == _shapes(model)


@pytest.mark.parametrize("importance", ["magnitude", "taylor"])
def test_an_importance_that_needs_values_is_refused_on_a_meta_model_which_stays_as_it_was(importance: str) -> None:
    meta, meta_inputs = _on_meta(slim_models.concat_depthwise_residual_cnn)
    before, shapes = exact_state(meta), _shapes(meta)
    with pytest.raises(prunereg.SlimError, match=rf"^importance {importance} ranks channels by values.*meta device"):
        prunereg.slim(meta, meta_inputs, ratio=0.5, importance=importance)
    assert_unchanged(meta, before)
    assert _shapes(meta) == shapes


def test_slimming_a_meta_model_by_its_masks_or_with_inputs_elsewhere_is_refused_up_front() -> None:
    meta, meta_inputs = _on_meta(slim_models.lenet)
    _, inputs = slim_models.lenet(0)
    before = exact_state(meta)
    with pytest.raises(prunereg.SlimError, match=r"is on the meta device.*slimming without a ratio reads.*masks"):
        prunereg.slim(meta, meta_inputs)
    with pytest.raises(prunereg.SlimError, match=r"is on the meta device.*and an example input is not"):
        prunereg.slim(meta, inputs, ratio=0.5, importance="random")
    assert_unchanged(meta, before)
    partly = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    partly[2].to("meta")
    with pytest.raises(prunereg.SlimError, match=r"^'2.weight' is on the meta device.*and '0.weight' is not"):
        prunereg.slim(partly, torch.randn(1, 4), ratio=0.5, importance="random")
