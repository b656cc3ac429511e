"""prunereg-rotate: a recovery method, a shrink method with a statistic of its own, and SliceGPT-style rotation.

Written on prunereg's public API alone (``prunereg``, ``prunereg.toolkit``,
``prunereg.testing``), as any third-party plugin is. prunereg imports this
module whenever it lists methods, so it imports no torch: it names the methods'
classes, imported on first use, and :func:`rotate` loads its module when called.
"""

from __future__ import annotations

import importlib
from typing import Any

import prunereg

__all__ = ["ChannelAffine", "MeanAbsSP", "RotationReport", "rotate", "rotate_by"]

_METHODS = [
    (
        "channel_affine",
        "recovery:ChannelAffine",
        "recovery",
        "Fit a scale and a shift per output channel of each block's o_proj/down_proj to the dense output",
    ),
    (
        "mean_abs_sp",
        "shrink:MeanAbsSP",
        "shrink",
        "Remove channels and heads of low mean |input activation| x weight column norm",
    ),
]

_LAZY = {
    "ChannelAffine": "recovery",
    "MeanAbsSP": "shrink",
    "RotationReport": "rotation",
    "rotate": "rotation",
    "rotate_by": "rotation",
}


@prunereg.hookimpl
def prunereg_register_methods(register: prunereg.Register) -> None:
    for name, target, kind, summary in _METHODS:
        register(name, f"{__name__}.{target}", kind=kind, summary=summary)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'prunereg_rotate' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
