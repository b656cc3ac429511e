"""Which of the teacher's decoder blocks each block of the recovered model stands for, and whether they fit.

A shrunk or pruned model keeps its blocks in order: block ``i`` is the teacher's
block ``i`` unless blocks were removed. Then the teacher's removed blocks are
named (``removed_blocks``, as :attr:`prunereg.ShrinkReport.removed_blocks`
lists them), or found: shrinking, pruning and refitting never change a block's
norms, and leave every tensor they do not cut or refit as it was, so the blocks
are matched, in order, to the teacher's blocks with their norms and the most
equal tensors (when that choice is the only one). A teacher whose tensors are smaller than the model's, or of another
architecture, is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from prunereg._recover.runtime import plain_class


@dataclass(frozen=True)
class Matching:
    """The teacher's blocks per block of the model: ``leading`` are removed before the first, ``spans[i]`` are
    block ``i``'s own (first) and those removed right after it."""

    leading: tuple[int, ...]
    spans: tuple[tuple[int, ...], ...]


def match_blocks(
    blocks: nn.ModuleList, teacher_blocks: nn.ModuleList, removed: Sequence[int] | None, path: str
) -> Matching:
    """Each block's teacher blocks; a one-line ``ValueError`` when the teacher cannot be the model's."""
    n_student, n_teacher = len(blocks), len(teacher_blocks)
    if n_teacher < n_student:
        raise ValueError(
            f"the teacher has {n_teacher} blocks in {path} and the model {n_student}: "
            "the teacher must be the model before shrinking"
        )
    if removed is not None:
        if len(removed) != n_teacher - n_student or any(i >= n_teacher for i in removed):
            raise ValueError(
                f"removed_blocks={list(removed)} does not name the {n_teacher - n_student} blocks of the teacher's "
                f"{n_teacher} that the model's {n_student} lack"
            )
        kept = [i for i in range(n_teacher) if i not in set(removed)]
    elif n_teacher == n_student:
        kept = list(range(n_student))
    else:
        kept = _find_kept(blocks, teacher_blocks, path)
    for index, teacher_index in enumerate(kept):
        check_fits(blocks[index], teacher_blocks[teacher_index], f"{path}.{index}", f"{path}.{teacher_index}")
    bounds = [*kept, n_teacher]
    spans = tuple(tuple(range(bounds[i], bounds[i + 1])) for i in range(n_student))
    return Matching(tuple(range(kept[0])), spans)


def _find_kept(blocks: nn.ModuleList, teacher_blocks: nn.ModuleList, path: str) -> list[int]:
    """The teacher's block each block is: the one order-keeping assignment that agrees most, if it is the only one.

    A block can be the teacher's block ``j`` only if their norms are equal
    (shrinking, pruning and refitting leave norms alone); among the
    assignments that keep the blocks' order, the one with the most equal
    tensors wins. None, or several equally good: a ``ValueError`` asking for
    ``removed_blocks``.
    """
    n_student, n_teacher = len(blocks), len(teacher_blocks)
    scores = [[_agreement(block, teacher) for teacher in teacher_blocks] for block in blocks]
    # best[j]: (score, ways, teacher indices) of the best assignment of the blocks so far, the last one to j
    best: list[tuple[int, int, list[int]] | None] = [
        (score, 1, [j]) if score is not None else None for j, score in enumerate(scores[0])
    ]
    for index in range(1, n_student):
        row: list[tuple[int, int, list[int]] | None] = [None] * n_teacher
        for j, score in enumerate(scores[index]):
            earlier = [entry for entry in best[:j] if entry is not None]
            if score is None or not earlier:
                continue
            top = max(entry[0] for entry in earlier)
            ways = sum(entry[1] for entry in earlier if entry[0] == top)
            chosen = next(entry for entry in earlier if entry[0] == top)
            row[j] = (top + score, ways, [*chosen[2], j])
        best = row
    finals = [entry for entry in best if entry is not None]
    highest = max((entry[0] for entry in finals), default=None)
    winners = [entry for entry in finals if entry[0] == highest]
    if not winners or sum(entry[1] for entry in winners) > 1:
        why = "none of them fits" if not winners else "several fit equally well"
        raise ValueError(
            f"cannot tell which of the teacher's {n_teacher} blocks the model's {n_student} in {path} are ({why}); "
            "pass removed_blocks=[...] (the ShrinkReport's removed_blocks)"
        )
    return winners[0][2]


def _agreement(block: nn.Module, teacher: nn.Module) -> int | None:
    """How many tensors of equal name and shape ``block`` and ``teacher`` hold equal; None if their norms differ.

    The norms are the one-dimensional tensors that are not biases.
    """
    theirs = dict(teacher.named_parameters())
    shared = [
        (parameter, theirs[name], parameter.dim() == 1 and not name.endswith("bias"))
        for name, parameter in block.named_parameters()
        if name in theirs and theirs[name].shape == parameter.shape
    ]
    for mine, other, is_norm in shared:
        if is_norm and not torch.equal(mine.detach().cpu(), other.detach().cpu()):
            return None
    return sum(torch.equal(mine.detach().cpu(), other.detach().cpu()) for mine, other, _ in shared)


def check_fits(block: nn.Module, teacher: nn.Module, where: str, teacher_where: str) -> None:
    """Refuse a teacher block that cannot be what ``block`` was: another class, or a tensor smaller than the block's.

    A tensor of the block the teacher lacks may only be a bias (a bias compensation or a refit added it).
    """
    kind, teacher_kind = plain_class(block).__name__, plain_class(teacher).__name__  # the same, sharded or not
    if kind != teacher_kind:
        raise ValueError(
            f"{where} is a {kind} and the teacher's {teacher_where} a {teacher_kind}: "
            "the teacher must be the model before shrinking"
        )
    theirs = dict(teacher.named_parameters())
    for name, parameter in block.named_parameters():
        other = theirs.get(name)
        if other is None:
            if name.rpartition(".")[2] == "bias":
                continue
            raise ValueError(f"the teacher's {teacher_where} has no {name}, which {where} has")
        larger = parameter.dim() != other.dim() or any(a > b for a, b in zip(parameter.shape, other.shape))
        if larger:
            raise ValueError(
                f"{where}.{name} is {tuple(parameter.shape)} and the teacher's {tuple(other.shape)}: "
                "the teacher must be the model before shrinking"
            )
