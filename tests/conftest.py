"""Shared fixtures: the devices every test runs on, and a clean plugin registry."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

# prunereg's own suite runs plugins in strict mode: a broken or clashing
# installed plugin fails it instead of warning (subprocesses inherit this).
os.environ["PRUNEREG_STRICT_PLUGINS"] = "1"

DEVICES = ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """Each torch device this machine has: cpu and meta always, cuda when present."""
    return request.param


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    """The process-wide registry loads anew in the test and is forgotten after it."""
    from prunereg._plugins import loading as _plugins

    _plugins.reset()
    yield
    _plugins.reset()
