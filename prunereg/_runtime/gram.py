"""Gram matrices ``x^T x`` summed in tiles on and above the diagonal, then mirrored in place.

``x^T x`` is symmetric, so a quarter to a half of its products (per the width)
need not be computed: :func:`add_upper_gram` sums the upper tiles only, and
:func:`mirror_upper_gram` fills the lower ones once, at the end, tile by tile,
so that no second full-size matrix is ever allocated (a wide MLP's Hessian is
gigabytes).
"""

from __future__ import annotations

from torch import Tensor

#: Side of the square tiles in which :func:`add_upper_gram` sums a Gram matrix.
GRAM_TILE = 256


def add_upper_gram(gram: Tensor, x: Tensor, *, beta: float, alpha: float) -> None:
    """``gram = beta * gram + alpha * x^T x`` on the tiles on and above the diagonal; the others are left alone.

    Where ``x`` has a lower precision than ``gram`` (float32 products summed
    into float64), each tile's product is made in ``x``'s and added in ``gram``'s.
    """
    width = x.shape[1]
    for row in range(0, width, GRAM_TILE):
        rows = slice(row, row + GRAM_TILE)
        for column in range(row, width, GRAM_TILE):
            columns = slice(column, column + GRAM_TILE)
            _add_tile(gram[rows, columns], x[:, rows].T, x[:, columns], beta=beta, alpha=alpha)


def add_product(total: Tensor, left: Tensor, right: Tensor) -> None:
    """``total += left @ right``, made in the factors' precision and added in ``total``'s, a tile of rows at a time."""
    for row in range(0, left.shape[0], GRAM_TILE):
        rows = slice(row, row + GRAM_TILE)
        _add_tile(total[rows], left[rows], right, beta=1.0, alpha=1.0)


def _add_tile(tile: Tensor, left: Tensor, right: Tensor, *, beta: float, alpha: float) -> None:
    if tile.dtype == left.dtype:
        tile.addmm_(left, right, beta=beta, alpha=alpha)
        return
    if beta != 1.0:
        tile.mul_(beta)
    tile.add_(left @ right, alpha=alpha)


def mirror_upper_gram(gram: Tensor) -> None:
    """Fill the tiles below the diagonal of a Gram matrix that :func:`add_upper_gram` summed, in place.

    The diagonal tiles are made exactly symmetric as well.
    """
    width = gram.shape[0]
    for row in range(0, width, GRAM_TILE):
        rows = slice(row, row + GRAM_TILE)
        diagonal = gram[rows, rows]
        diagonal.copy_(diagonal.triu() + diagonal.triu(diagonal=1).T)
        for column in range(row + GRAM_TILE, width, GRAM_TILE):
            columns = slice(column, column + GRAM_TILE)
            gram[columns, rows].copy_(gram[rows, columns].T)
