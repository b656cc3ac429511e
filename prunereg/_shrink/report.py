"""What :func:`prunereg.shrink` did: parameters before and after, what each block kept, which blocks went."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

#: The unit kinds a block reports, in table order, with their column titles.
UNIT_COLUMNS = {"mlp": "MLP CHANNELS", "heads": "KV GROUPS", "experts": "EXPERTS"}


@dataclass
class BlockShrink:
    """One decoder block of the model as it was: its units kept and before (by kind), and whether it was removed."""

    index: int
    kept: dict[str, int] = field(default_factory=dict)
    before: dict[str, int] = field(default_factory=dict)
    removed: bool = False
    score: float | None = None
    """The method's block score, when blocks were scored (the lowest are removed)."""


@dataclass
class ShrinkReport:
    """The result of :func:`prunereg.shrink`.

    ``blocks`` has one entry per decoder block of the model before the call;
    ``removed_blocks`` their indices that were taken out; ``config`` each config
    key that changed, as ``[before, after]`` (the per-block record ``prunereg_slimmed``
    left out). ``str(report)`` is a table, :meth:`as_dict` / :meth:`to_json` the
    same as plain data.
    """

    method: str
    params_before: int
    params_after: int
    n_tokens: int
    blocks_path: str
    blocks: list[BlockShrink] = field(default_factory=list)
    removed_blocks: list[int] = field(default_factory=list)
    config: dict[str, list[Any]] = field(default_factory=dict)
    seconds: float = 0.0
    needs_prunereg_loader: bool = False
    """The blocks kept different widths (``allocation="global"``), which the config cannot state: the saved
    model loads with ``prunereg.from_pretrained``, not stock ``from_pretrained``."""
    recovery: Any = None
    """The :class:`prunereg.RecoverReport` of ``recover=``: each block's calibration loss before and after."""
    rounds: list[ShrinkReport] = field(default_factory=list)
    """With ``steps=k``: each round's own report."""

    @property
    def params_ratio(self) -> float:
        """Parameters after over parameters before."""
        return self.params_after / self.params_before if self.params_before else 1.0

    def as_dict(self) -> dict[str, Any]:
        """Plain data (lists, numbers, strings) for JSON."""
        return {**asdict(self), "params_ratio": self.params_ratio}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def __str__(self) -> str:
        kinds = [kind for kind in UNIT_COLUMNS if any(kind in block.before for block in self.blocks)]
        scored = any(block.score is not None for block in self.blocks)
        header = ["BLOCK", *(UNIT_COLUMNS[kind] for kind in kinds), *(["SCORE"] if scored else []), "REMOVED"]
        rows = [header]
        for block in self.blocks:
            cells = [f"{self.blocks_path}.{block.index}"]
            cells += [f"{block.kept[kind]}/{block.before[kind]}" if kind in block.before else "-" for kind in kinds]
            if scored:
                cells.append(f"{block.score:.4f}" if block.score is not None else "-")
            cells.append("yes" if block.removed else "")
            rows.append(cells)
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        source = f"from {self.n_tokens} calibration tokens" if self.n_tokens else "without calibration data"
        lines.insert(
            0,
            f"{self.method}: {self.params_before:,} -> {self.params_after:,} parameters "
            f"({self.params_ratio:.1%}), {len(self.removed_blocks)} blocks removed, {source}, {self.seconds:.1f} s",
        )
        if self.rounds:
            lines.append(f"in {len(self.rounds)} rounds")
        if self.recovery is not None:
            lines.append(f"recovered with {str(self.recovery).splitlines()[0]}")
        if self.needs_prunereg_loader:
            lines.append(
                "the blocks keep different widths, which the config cannot state: load the saved model with "
                "prunereg.from_pretrained"
            )
        return "\n".join(lines)
