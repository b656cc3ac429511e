"""What :func:`prunereg.recover` did: per block, the calibration loss before and after, the time, what changed."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class BlockRecovery:
    """One step of recovery: a decoder block (``index``), or the whole model (``index`` None).

    ``loss_before`` / ``loss_after`` are the calibration objective (a block: the
    mean squared error of its output against the dense model's; the model: the
    mean KL divergence of its next-token distributions from the dense model's)
    before the method and as the model is left. ``changed`` lists the
    parameters whose values changed; ``kept_original`` says the method's result
    was worse and was undone.
    """

    index: int | None
    teacher_indices: list[int] = field(default_factory=list)
    loss_before: float = 0.0
    loss_after: float = 0.0
    seconds: float = 0.0
    changed: list[str] = field(default_factory=list)
    kept_original: bool = False
    note: str = ""


@dataclass
class RecoverReport:
    """The result of :func:`prunereg.recover`.

    ``steps`` has one entry per decoder block of the recovered model (or one for
    the whole model); ``config`` each config key that changed, as ``[before,
    after]`` (a bias switched on). ``str(report)`` is a table, :meth:`as_dict`
    / :meth:`to_json` the same as plain data.
    """

    method: str
    blocks_path: str
    n_tokens: int
    steps: list[BlockRecovery] = field(default_factory=list)
    config: dict[str, list[Any]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def undone(self) -> list[int | None]:
        """The steps whose result was worse than before and was undone (their block index; None: the model)."""
        return [step.index for step in self.steps if step.kept_original]

    def as_dict(self) -> dict[str, Any]:
        """Plain data (lists, numbers, strings) for JSON."""
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def __str__(self) -> str:
        header = ["BLOCK", "TEACHER", "LOSS BEFORE", "LOSS AFTER", "SECONDS", "CHANGED", "NOTE"]
        rows = [header]
        for step in self.steps:
            where = f"{self.blocks_path}.{step.index}" if step.index is not None else "model"
            teacher = ",".join(map(str, step.teacher_indices)) or "-"
            changed = f"{len(step.changed)} tensors" if step.changed else "-"
            note = step.note + (" (worse: kept as it was)" if step.kept_original else "")
            rows.append(
                [where, teacher, f"{step.loss_before:.4g}", f"{step.loss_after:.4g}", f"{step.seconds:.1f}", changed,
                 note.strip()]
            )  # fmt: skip
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        undone = len(self.undone)
        lines.insert(
            0,
            f"{self.method}: {len(self.steps)} steps from {self.n_tokens} calibration tokens, {self.seconds:.1f} s"
            + (f", {undone} left as they were (the method made them worse)" if undone else ""),
        )
        for key, (before, after) in self.config.items():
            lines.append(f"config {key}: {before!r} -> {after!r}")
        return "\n".join(lines)
