"""N:M semi-structured sparsity for prunereg, registered as the method ``nm_sparsity``.

This module only names the method; :class:`NMSparsity` (and torch) is imported
the first time it is asked for, so ``prunereg list`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

import prunereg

__all__ = ["NMSparsity"]


@prunereg.hookimpl
def prunereg_register_methods(register):
    register(
        "nm_sparsity",
        "prunereg_nm.method:NMSparsity",
        kind="global",
        summary="Keep the N largest of every M consecutive weights along a dim (2:4, 4:8)",
    )


def __getattr__(name: str) -> Any:
    if name == "NMSparsity":
        return importlib.import_module("prunereg_nm.method").NMSparsity
    raise AttributeError(f"module 'prunereg_nm' has no attribute {name!r}")
