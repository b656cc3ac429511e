"""What :func:`prunereg.slim` did: parameters and MACs before and after, and each tensor's old and new shape."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class TensorChange:
    """One parameter or buffer that lost positions."""

    name: str
    before: tuple[int, ...]
    after: tuple[int, ...]


@dataclass
class SlimReport:
    """The result of :func:`prunereg.slim`; ``print(report)`` shows a table, ``as_dict()`` is JSON-ready."""

    ratio: float | None
    importance: str | None
    params_before: int
    params_after: int
    macs_before: int
    macs_after: int
    groups: int
    """Dependency groups that could lose channels."""
    removed: int
    """Units removed (channels, heads, convolution groups), over all groups."""
    changes: list[TensorChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What was kept and why (masked channels that could not all go, modules left whole)."""
    config_rewritten: bool = False
    """Whether a Hugging Face config now describes the slimmed model (stock ``from_pretrained`` reloads it)."""

    @property
    def params_ratio(self) -> float:
        return self.params_after / self.params_before if self.params_before else 1.0

    @property
    def macs_ratio(self) -> float:
        return self.macs_after / self.macs_before if self.macs_before else 1.0

    def layer_changes(self) -> list[tuple[str, TensorChange]]:
        """One change per changed layer (module): its weight's, else its first tensor's; ``changes`` has them all."""
        by_layer: dict[str, TensorChange] = {}
        for change in self.changes:
            layer, _, tensor = change.name.rpartition(".")
            if layer not in by_layer or tensor == "weight":
                by_layer[layer] = change
        return [(layer or "(model)", change) for layer, change in by_layer.items()]

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["changes"] = [{"name": c.name, "before": list(c.before), "after": list(c.after)} for c in self.changes]
        return data

    def __str__(self) -> str:
        lines = [
            f"slimmed {'masked channels' if self.ratio is None else f'ratio {self.ratio:g}'}"
            + (f" by {self.importance}" if self.importance else "")
            + f": {self.removed} units removed in {self.groups} groups",
            f"parameters {_count(self.params_before)} -> {_count(self.params_after)} ({self.params_ratio:.1%})",
            f"MACs       {_count(self.macs_before)} -> {_count(self.macs_after)} ({self.macs_ratio:.1%})",
        ]
        layers = self.layer_changes()
        if layers:
            width = max(len("layer"), *(len(name) for name, _ in layers))
            lines += [
                "",
                f"{'layer':<{width}}  {'before':>18}  {'after':>18}",
                f"{'-' * width}  {'-' * 18}  {'-' * 18}",
            ]
            lines += [f"{name:<{width}}  {_shape(c.before):>18}  {_shape(c.after):>18}" for name, c in layers]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def _shape(shape: tuple[int, ...]) -> str:
    return " x ".join(str(s) for s in shape) or "scalar"


def _count(n: int) -> str:
    for unit, size in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)
