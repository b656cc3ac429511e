"""SparseGPT (Frantar and Alistarh 2023): prune by the OBS saliency and update the weights kept.

The layer's Hessian ``H = 2 X X^T / n`` is dampened and inverted once; the upper
Cholesky factor ``U`` of ``H^-1`` then drives a sweep over the input columns in
blocks. In each block the mask is chosen from ``w^2 / U_jj^2`` (unstructured: per
block, N:M: every M columns, after the earlier columns' updates), and each pruned
weight's error ``w / U_jj`` is spread over the later columns along row j of ``U``
(the optimal brain surgeon update). Layers that read one input (q/k/v, gate/up)
share ``H``: their rows are stacked and swept together, each layer choosing its
own mask within its rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from prunereg import CalibratedMethod, LayerStatistics, PrunedWeight
from prunereg.toolkit import lowest_n_of_m, lowest_overall


class SparseGPT(CalibratedMethod):
    """Prune with SparseGPT: unstructured or N:M, with the OBS update of the kept weights.

    ``blocksize`` columns share one mask choice and one deferred update of the later
    columns (the paper's 128); ``dampening`` adds that share of the mean Hessian
    diagonal to the diagonal before inverting (the paper's 1 %). Unstructured and N:M
    alike, a NaN saliency (a NaN weight) is pruned first, as everywhere in prunereg.
    """

    STATISTICS = frozenset({"hessian"})
    UPDATES_WEIGHTS = True

    def __init__(
        self, sparsity: float = 0.5, pattern: str | None = None, blocksize: int = 128, dampening: float = 0.01
    ) -> None:
        super().__init__(sparsity, pattern)
        if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize < 1:
            raise ValueError(f"blocksize must be a positive int, not {blocksize!r}")
        if self.n_m is not None and blocksize % self.n_m[1]:
            raise ValueError(f"blocksize {blocksize} must be a multiple of the pattern's M={self.n_m[1]}")
        if not dampening > 0:
            raise ValueError(f"dampening must be positive, not {dampening!r}")
        self.blocksize = blocksize
        self.dampening = float(dampening)

    def prune_group(
        self,
        weights: Sequence[torch.Tensor],
        statistics: LayerStatistics,
        sparsities: Sequence[float],
    ) -> list[PrunedWeight]:
        self.check_group(weights, statistics, sparsities)
        assert statistics.hessian is not None  # check_group made sure
        hessian = statistics.hessian.to(device=weights[0].device, dtype=weights[0].dtype)
        sizes = [weight.shape[0] for weight in weights]
        stacked, keep = obs_sweep(
            torch.cat(list(weights)),
            hessian,
            sizes,
            sparsities,
            n_m=self.n_m,
            blocksize=self.blocksize,
            dampening=self.dampening,
        )
        return [PrunedWeight(w, m) for w, m in zip(stacked.split(sizes), keep.split(sizes), strict=True)]


def upper_cholesky_of_inverse(hessian: torch.Tensor) -> torch.Tensor:
    """``U`` upper triangular with ``U^T U = hessian^-1``, without forming the inverse.

    The Cholesky factor of ``hessian`` with rows and columns reversed, reversed back,
    is an upper ``V`` with ``V V^T = hessian``; then ``U = V^-1``. One factorisation and
    one triangular solve: faster and more accurate than inverting and factorising again.
    """
    reversed_lower, info = torch.linalg.cholesky_ex(hessian.flip(0, 1))
    if info.item():
        if not bool(torch.isfinite(hessian).all()):  # no dampening repairs that: say what is wrong
            raise ValueError("SparseGPT: the Hessian holds NaN or inf: the layer's inputs are not finite")
        raise torch.linalg.LinAlgError(
            "SparseGPT: the dampened Hessian is not positive definite; raise `dampening` or calibrate on more tokens"
        )
    identity = torch.eye(hessian.shape[0], dtype=hessian.dtype, device=hessian.device)
    return torch.linalg.solve_triangular(reversed_lower.flip(0, 1), identity, upper=True)


def obs_sweep(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    layer_rows: Sequence[int],
    sparsities: Sequence[float],
    *,
    n_m: tuple[int, int] | None,
    blocksize: int,
    dampening: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseGPT on the stacked rows of some layers that share ``hessian``: ``(new weight, keep mask)``.

    ``weight`` (``[rows, in]``) is overwritten; ``layer_rows`` says how many of its rows
    each layer owns, ``sparsities`` each layer's target. Works in ``weight``'s dtype.
    """
    hessian = hessian.clone()
    dead = hessian.diagonal() == 0
    hessian.diagonal()[dead] = 1
    weight[:, dead] = 0
    hessian.diagonal().add_(dampening * hessian.diagonal().mean())
    factor = upper_cholesky_of_inverse(hessian)

    # Transposed, a column of the weight is a contiguous row: the sweep walks rows of `columns`.
    columns = weight.t().contiguous()
    pruned = torch.zeros_like(columns, dtype=torch.bool)
    layer_slices = _slices(layer_rows)
    n_inputs = columns.shape[0]
    for start in range(0, n_inputs, blocksize):
        end = min(start + blocksize, n_inputs)
        block, block_factor, block_pruned = columns[start:end], factor[start:end, start:end], pruned[start:end]
        diagonal = block_factor.diagonal()
        if n_m is None:
            saliency = (block / diagonal[:, None]).square_()
            for rows, sparsity in zip(layer_slices, sparsities, strict=True):
                block_pruned[:, rows] = lowest_overall(saliency[:, rows], sparsity)
        errors = _sweep_block(block, block_factor, block_pruned, n_m)
        columns[end:].addmm_(factor[start:end, end:].t(), errors, alpha=-1)
    pruned[dead] = True
    return columns.t(), pruned.logical_not_().t()


def _sweep_block(
    block: torch.Tensor, block_factor: torch.Tensor, block_pruned: torch.Tensor, n_m: tuple[int, int] | None
) -> torch.Tensor:
    """Prune one block of columns in order, updating the block's later columns; return the scaled errors.

    ``block`` (``[columns, rows]``) ends pruned and updated; with a pattern, ``block_pruned``
    is filled here, M columns at a time, from the weights as updated so far. Two tensor
    operations per column: the error of its pruned weights, and its update of the later
    columns. Column i is final once swept (only later columns are updated), so the pruned
    weights are zeroed once, at the end.
    """
    diagonal = block_factor.diagonal()
    error_scale = block_pruned / diagonal[:, None]  # 1 / U_ii where pruned, 0 where kept
    errors = torch.empty_like(block)
    for i in range(block.shape[0]):
        if n_m is not None and i % n_m[1] == 0:
            group = slice(i, i + n_m[1])
            saliency = (block[group] / diagonal[group, None]).square_()
            block_pruned[group] = lowest_n_of_m(saliency.t(), *n_m).t()
            torch.div(block_pruned[group], diagonal[group, None], out=error_scale[group])
        torch.mul(block[i], error_scale[i], out=errors[i])
        block[i + 1 :].addmm_(block_factor[i, i + 1 :, None], errors[i, None], alpha=-1)
    block.masked_fill_(block_pruned, 0)
    return errors


def _slices(sizes: Sequence[int]) -> list[slice]:
    """Consecutive slices of the given sizes."""
    bounds = [0, *itertools.accumulate(sizes)]
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]
