"""The sparsity tables that ``prunereg report`` and :func:`prunereg.summary` print: aligned columns and bars."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def percent(sparsity: float) -> str:
    """``0.476`` as ``47.6%``."""
    return f"{100 * sparsity:.1f}%"


def bar(sparsity: float, width: int = 10) -> str:
    """``[#####.....]``: the share of zeros as filled cells."""
    filled = round(sparsity * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def aligned(lines: Sequence[Sequence[str]], right_aligned: Collection[int]) -> str:
    """The cells of ``lines`` in columns two spaces apart; columns in ``right_aligned`` (numbers) to the right."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(
            cell.rjust(width) if i in right_aligned else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths))
        ).rstrip()
        for line in lines
    )
