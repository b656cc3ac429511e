"""Shared fixtures: the devices every test runs on, and a clean plugin registry; how xdist hands out the tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

# prunereg's own suite runs plugins in strict mode: a broken or clashing
# installed plugin fails it instead of warning (subprocesses inherit this).
os.environ["PRUNEREG_STRICT_PLUGINS"] = "1"

# Under pytest-xdist (-n, pyproject's addopts) each worker gets its share of the cores, as do the processes
# its tests start: torch's default of every core per process ran 2 x 2 threads on 2 cores, spin-waiting on
# each other (a test sets its own count where it measures threads). OMP_NUM_THREADS, when set, is the user's.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# Tests each parametrization of which is long enough (minutes of a CPU) to be a unit of work of its own under
# pytest-xdist, handed out before the modules (tests/support/xdist_scheduler.py): the runs on SmolLM2-135M.
LONG_TESTS = ("tests/project/test_docs_llm_commands.py::test_every_chain_of_the_walkthrough_runs_as_written",)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which may be left out (-p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadscope`` (pyproject's addopts): a module to a worker, the :data:`LONG_TESTS` first."""
    if config.getvalue("dist") != "loadscope":
        return None  # xdist's own scheduler for the mode asked for
    from tests.support.xdist_scheduler import LongTestsFirst

    return LongTestsFirst(config, log, LONG_TESTS)


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
