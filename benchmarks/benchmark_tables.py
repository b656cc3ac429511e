"""The tables of docs/benchmarks.md read back: what the plots draw and the README's figures are checked against."""

from __future__ import annotations

import re


def tables(markdown: str) -> dict[str, list[dict[str, str]]]:
    """The rows of each ``## `` section's tables as ``{column: cell}``, one list per section (its tables joined)."""
    found: dict[str, list[dict[str, str]]] = {}
    for section in re.split(r"\n(?=## )", markdown)[1:]:
        lines = section.splitlines()
        rows: list[dict[str, str]] = []
        header: list[str] | None = None
        for line in lines[1:]:
            if not line.startswith("|"):
                header = None
                continue
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif not set("".join(cells)) <= set("-: "):
                rows.append(dict(zip(header, cells)))
        found[lines[0][3:].strip()] = rows
    return found


def number(cell: str) -> float:
    """``18.9x``, ``+11.75x``, ``+0.9%``, ``30.7``, ``12.5 us``, ``59.9 ms``, ``1.13 s`` as a float (times: seconds)."""
    match = re.fullmatch(r"\+?(-?[\d.]+)\s*(x|%|s|ms|us)?", cell.strip())
    if match is None:
        raise ValueError(f"not a figure: {cell!r}")
    return float(match.group(1)) * {"ms": 1e-3, "us": 1e-6}.get(match.group(2) or "", 1.0)
