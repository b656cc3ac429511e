"""What the conformance checks of the engines' method kinds share (``prunereg.testing``).

Each check runs on the devices at hand (:func:`default_devices`) and names the
method, the check and the device in its ``AssertionError`` (:func:`step`). A
method that asks for a statistic a plugin registered gets it gathered by that
statistic over the check's made-up data (:func:`sampled`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from typing import Any, TypeVar

import torch

from prunereg._runtime.registry import at_site
from prunereg._runtime.statistics import Observation


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


def sampled(names: Collection[str], site: str, observation: Observation, leave_out: Collection[str]) -> dict[str, Any]:
    """The results of those statistics ``names`` observed at ``site`` (but ``leave_out``), each over ``observation``."""
    results = {}
    for name, cls in at_site(set(names) - set(leave_out), site).items():
        statistic = cls()
        statistic.fold(observation)
        results[name] = statistic.result()
    return results


_Contract = TypeVar("_Contract")


def method_class(method: str | type, contract: type[_Contract], noun: str) -> tuple[type[_Contract], str]:
    """The class a kind's conformance check tests, and the label its failures start with.

    ``method`` is a registered name (which must be registered as the contract's
    kind) or a class; an AssertionError names a class that is not a subclass of
    ``contract`` or whose ``PRUNING_TYPE`` is not the kind's.
    """
    kind = getattr(contract, "PRUNING_TYPE")  # noqa: B009 (a contract class declares it; object does not)
    if isinstance(method, str):
        from prunereg._plugins.loading import registry

        info = registry().info(method)
        cls = registry().resolve(method)
        label = f"{noun} {method!r} ({info.target})"
        if info.kind != kind:
            raise AssertionError(f"{label}: registered as kind {info.kind!r}, not {kind!r}")
    else:
        cls, label = method, f"{noun} {getattr(method, '__qualname__', method)!r}"
    if not (isinstance(cls, type) and issubclass(cls, contract)):
        raise AssertionError(f"{label}: not a prunereg.{contract.__name__} subclass")
    declared = getattr(cls, "PRUNING_TYPE", None)
    if declared != kind:
        raise AssertionError(f"{label}: PRUNING_TYPE must be {kind!r}, not {declared!r}")
    return cls, label
