"""The kinds of pruning methods: each names the contract its classes fulfil, without importing it.

A registration says its method's kind (``register(..., kind="calibrated")``)
and the class's ``PRUNING_TYPE`` says it again; when the class is imported the
registry checks that it subclasses the kind's contract. Listing methods must
not import torch, so a kind names its contract as a ``"module:Class"`` string,
and a new contract is one :func:`declare_kind` line below. Its module imports
nothing, so the kinds are known wherever the registry is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MASK_CONTRACT = "prunereg._core.method:BasePruningMethod"
"""The contract of torch's mask methods (``apply``, ``compute_mask``)."""

_CONTRACT = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", re.ASCII)


@dataclass(frozen=True)
class Kind:
    """One kind of pruning method: its name, the class its methods subclass, and how they are run."""

    name: str
    contract: str
    """``"module:Class"``: every method class of this kind subclasses it and sets ``PRUNING_TYPE = name``."""
    runs_with: str
    """How users run methods of this kind, in Markdown (the docs' tables show it)."""
    commands: str
    """The ``prunereg`` commands that run them, as ``prunereg list`` shows it (without importing a class)."""

    @property
    def contract_module(self) -> str:
        return self.contract.partition(":")[0]

    @property
    def contract_class(self) -> str:
        return self.contract.partition(":")[2]

    @property
    def masks(self) -> bool:
        """Whether methods of this kind are torch-style mask methods (``apply``, ``compute_mask``)."""
        return self.contract == MASK_CONTRACT


_KINDS: dict[str, Kind] = {}


def declare_kind(name: str, contract: str, runs_with: str, commands: str = "Python only") -> Kind:
    """Make ``name`` a kind that methods can register as, checked against ``contract`` (``"module:Class"``)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"a kind is a lowercase identifier, not {name!r}")
    if not _CONTRACT.fullmatch(contract):
        raise ValueError(f"a kind's contract must look like 'package.module:Class', not {contract!r}")
    if name in _KINDS:
        raise ValueError(f"kind {name!r} is already declared, with contract {_KINDS[name].contract!r}")
    kind = _KINDS[name] = Kind(name, contract, runs_with, commands)
    return kind


def kinds() -> tuple[Kind, ...]:
    """Every declared kind, in declaration order."""
    return tuple(_KINDS.values())


def kind_names(*, masks: bool | None = None) -> tuple[str, ...]:
    """The names of the declared kinds; ``masks=True``: of torch-style mask methods only, ``False``: the others."""
    return tuple(kind.name for kind in kinds() if masks is None or kind.masks == masks)


def kind(name: object) -> Kind:
    """The kind called ``name``; ``ValueError`` naming the known kinds when there is none (or no string)."""
    found = _KINDS.get(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"kind must be one of {', '.join(_KINDS)}, not {name!r}")
    return found


_APPLY = "`prunereg.get(name).apply(module, name, ...)`"
declare_kind(
    "unstructured",
    MASK_CONTRACT,
    f"{_APPLY}, `prunereg.global_unstructured`, `prunereg prune`",
    commands="prune, prune --global",
)
declare_kind("structured", MASK_CONTRACT, f"{_APPLY}, `prunereg prune`", commands="prune")
declare_kind("global", MASK_CONTRACT, _APPLY, commands="prune")
declare_kind(
    "calibrated",
    "prunereg._oneshot.contract:CalibratedMethod",
    "`prunereg.oneshot`, `prunereg oneshot`; `prunereg prune` if it needs no calibration",
    commands="oneshot; prune if calibration-free",
)
declare_kind(
    "shrink",
    "prunereg._shrink.contract:ShrinkMethod",
    "`prunereg.shrink`, `prunereg shrink`",
    commands="shrink",
)
declare_kind(
    "recovery",
    "prunereg._recover.contract:RecoveryMethod",
    "`prunereg.recover(model, teacher, calibration, method=name)`, `prunereg.shrink(..., recover=name)`, "
    "`prunereg shrink --recover`",
    commands="prunereg.recover; shrink --recover (block by block)",
)
declare_kind(
    "importance",
    "prunereg._slim.importance:Importance",
    "`prunereg.slim(model, inputs, ratio=r, importance=name)`, `prunereg slim --importance`",
    commands="slim --importance",
)
