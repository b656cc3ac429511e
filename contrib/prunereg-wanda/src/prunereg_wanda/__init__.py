"""Wanda (Sun et al. 2023) for prunereg, registered as the method ``wanda``.

This module only names the method; the classes and functions below (and torch)
are imported the first time one of them is used, so ``prunereg list`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

import prunereg

__all__ = ["InputNorms", "WandaPruning", "linear_layers", "prune_model", "wanda_scores"]

_LAZY = {
    "WandaPruning": "prunereg_wanda.method",
    "wanda_scores": "prunereg_wanda.method",
    "InputNorms": "prunereg_wanda.calibration",
    "linear_layers": "prunereg_wanda.calibration",
    "prune_model": "prunereg_wanda.model",
}


@prunereg.hookimpl
def prunereg_register_methods(register):
    register(
        "wanda",
        "prunereg_wanda.method:WandaPruning",
        kind="global",
        summary="Prune each output row's lowest |weight| x input-activation-norm scores (Wanda)",
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'prunereg_wanda' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
