"""One call from a model and calibration batches to a Wanda-pruned model."""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from prunereg.toolkit import all_or_nothing, check_amount
from prunereg_wanda.calibration import InputNorms, linear_layers
from prunereg_wanda.method import WandaPruning


def prune_model(
    model: nn.Module,
    calibration_batches: Iterable[Any],
    amount: numbers.Real,
    layers: Iterable[str] | None = None,
) -> nn.Module:
    """Prune ``amount`` of every output row of the chosen Linear layers' weights with Wanda.

    Runs ``model`` in eval mode without gradients on each batch (a tensor is
    passed as ``model(batch)``, a tuple or list as ``model(*batch)``, a mapping
    as ``model(**batch)``) to measure the input-feature norms, then prunes each
    layer's ``weight``. ``layers`` names the Linear submodules (default: all).
    The norms come from the unpruned model in one pass; the paper's reference
    code instead feeds each transformer block the output of the pruned blocks
    before it, which :class:`InputNorms` used block by block reproduces.
    If anything fails, no layer is pruned.
    """
    check_amount(amount)
    chosen = linear_layers(model, layers)
    if not chosen:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layer to prune")
    with InputNorms(chosen) as recorder, _eval_mode(model), torch.no_grad():
        for batch in calibration_batches:
            _forward(model, batch)
    norms = recorder.norms()
    with all_or_nothing([(layer, "weight") for layer in chosen.values()]):
        for name, layer in chosen.items():
            WandaPruning.apply(layer, "weight", amount=amount, activation_norms=norms[name])
    return model


def _forward(model: nn.Module, batch: Any) -> None:
    if isinstance(batch, Mapping):
        model(**batch)
    elif isinstance(batch, (tuple, list)):
        model(*batch)
    else:
        model(batch)


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Put every submodule in eval mode for the block, then give each its own mode back."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training
