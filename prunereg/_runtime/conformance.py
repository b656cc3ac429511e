"""What the conformance checks of the engines' method kinds share (``prunereg.testing``).

Each check runs on the devices at hand (:func:`default_devices`) and names the
method, the check and the device in its ``AssertionError`` (:func:`step`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def step(label: str, what: str) -> Iterator[None]:
    """Within the block, an ``AssertionError`` is raised again prefixed with ``label`` (the method) and ``what``."""
    try:
        yield
    except AssertionError as error:
        raise AssertionError(f"{label}, {what}: {error}") from None


def default_devices() -> list[str]:
    """The devices a check runs on unless told: the CPU, and CUDA when present."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
