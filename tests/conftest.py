"""Shared fixtures: the devices every test runs on, and a clean plugin registry."""

from __future__ import annotations

import pytest
import torch

DEVICES = ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """Each torch device this machine has: cpu and meta always, cuda when present."""
    return request.param
