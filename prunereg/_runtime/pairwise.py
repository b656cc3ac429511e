"""Partial results over calibration batches, combined along one fixed binary tree over the batch indices.

Floating-point sums depend on their order. For the statistics of a run to be
the same bits however its batches are split among ranks, every partial result
covers an aligned span of batches (``[index * 2**level, (index + 1) * 2**level)``)
and is only ever combined with its sibling span, the left one taking in the
right one; the spans left at the end are combined left to right. A rank that
holds a contiguous range of batches builds every span inside its range; the
ranks' leftover spans, taken in rank order, complete the same tree. One
process holds at most ``log2(batches) + 2`` partials at a time, not one per batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

_C = TypeVar("_C", bound="Combinable")


class Combinable(Protocol):
    """A partial result that takes in another over the batches that follow its own, in place."""

    def combine(self: _C, other: _C) -> None: ...


_T = TypeVar("_T", bound=Combinable)


@dataclass
class Span(Generic[_T]):
    """A partial result over batches ``[index * 2**level, (index + 1) * 2**level)``."""

    level: int
    index: int
    value: _T


class PairwiseTree(Generic[_T]):
    """The spans gathered so far, in batch order, each combined with its sibling as soon as both are here."""

    def __init__(self) -> None:
        self.spans: list[Span[_T]] = []

    def add(self, batch: int, value: _T) -> None:
        """Take in the partial result of batch ``batch`` (batches come in increasing order)."""
        self.push(Span(0, batch, value))

    def push(self, span: Span[_T]) -> None:
        """Take in ``span`` (after every span pushed so far), combining siblings upwards."""
        spans = self.spans
        spans.append(span)
        while len(spans) > 1:
            left, right = spans[-2], spans[-1]
            if left.level != right.level or left.index % 2 or right.index != left.index + 1:
                break
            left.value.combine(right.value)
            spans[-2:] = [Span(left.level + 1, left.index // 2, left.value)]

    def total(self) -> _T | None:
        """Every span combined, left to right (None for none); the tree is then that one span, a sibling of none."""
        if not self.spans:
            return None
        first, *rest = self.spans
        for span in rest:
            first.value.combine(span.value)
        self.spans = [Span(-1, 0, first.value)]
        return first.value
