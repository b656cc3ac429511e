"""Damped least squares from normal equations: the solve that ``refit`` and ``replace`` share.

For a fit ``[X 1] [W^T; b] ~ R`` with statistics ``G = [X 1]^T [X 1]`` and
``C = [X 1]^T R`` (float64, :class:`prunereg.NormalEquations`), the solution of
``(G + D) [W^T; b] = C`` minimises ``||[X 1][W^T; b] - R||^2 + lambda ||W||^2``,
where ``D`` adds ``lambda = ridge * mean(diag(X^T X))`` to the diagonal of the
inputs only: the intercept ``b`` is not damped. On a masked model each output
row ``r`` is solved over its kept inputs alone (the others stay zero), rows of
the same mask together: from the unmasked solution, corrected by the columns
of the system's inverse at the pruned inputs, so that the one factorisation
serves every mask (a shrunk model's few exact zeros cost almost nothing).
Each mask's solve is one piece of work that ``spread`` may hand to another
rank (:meth:`prunereg.RecoveryBlock.solve_spread`): it is solved whole wherever it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from prunereg import NormalEquations

#: Solves pieces of work, ``solve(i)`` for each of ``costs``, and gives their results in order (on some rank each).
Spread = Callable[[Sequence[float], Callable[[int], torch.Tensor]], list[torch.Tensor]]


def here(costs: Sequence[float], solve: Callable[[int], torch.Tensor]) -> list[torch.Tensor]:
    """Every piece solved in this process, in order: the :data:`Spread` of one process."""
    return [solve(index) for index in range(len(costs))]


def damped_solution(
    equations: NormalEquations,
    *,
    ridge: float,
    intercept: bool,
    kept: torch.Tensor | None = None,
    spread: Spread = here,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The damped least-squares ``weight`` (``[out, in]``) and ``bias`` (``[out]``, None without intercept), float64.

    ``kept`` (bool ``[out, in]``): the inputs each output row may use; a weight
    outside it is exactly zero. ``spread`` solves the rows of each distinct
    mask (the costly part of a masked solve), here or over ranks.
    """
    n = equations.n_inputs
    size = n + 1 if intercept else n
    system = equations.gram[:size, :size].clone()
    rhs = equations.cross[:size]
    diagonal = system.diagonal()
    diagonal[:n] += ridge * float(diagonal[:n].mean()) if n else 0.0
    factor, info = torch.linalg.cholesky_ex(system)
    if kept is None:
        coefficients = _solve(system, rhs, factor if int(info) == 0 else None)
    elif int(info) == 0:
        coefficients = _masked_by_correction(factor, rhs, kept.to(device=rhs.device, dtype=torch.bool), spread)
    else:
        coefficients = _masked_by_groups(system, rhs, kept.to(device=rhs.device, dtype=torch.bool), spread)
    weight = coefficients[:n].T.contiguous()
    return weight, (coefficients[n].clone() if intercept else None)


def _masked_by_correction(factor: torch.Tensor, rhs: torch.Tensor, kept: torch.Tensor, spread: Spread) -> torch.Tensor:
    """Each row over its kept inputs, for a positive definite system of Cholesky ``factor``.

    With ``H`` the system's inverse, ``x`` a row's unmasked solution and ``E``
    its pruned inputs, the solution with ``x_E = 0`` is ``x - H[:, E] H[E, E]^-1 x_E``
    (the Lagrange condition of the constraint), set to exactly zero on ``E``.
    """
    coefficients = torch.cholesky_solve(rhs, factor)
    pruned_anywhere = (~kept).any(0).nonzero().squeeze(1)
    if not pruned_anywhere.numel():
        return coefficients
    unit = torch.zeros(factor.shape[0], pruned_anywhere.numel(), dtype=factor.dtype, device=factor.device)
    unit[pruned_anywhere, torch.arange(pruned_anywhere.numel(), device=factor.device)] = 1
    inverse_columns = torch.cholesky_solve(unit, factor)  # H[:, pruned_anywhere]
    column_of = torch.full((factor.shape[0],), -1, dtype=torch.long, device=factor.device)
    column_of[pruned_anywhere] = torch.arange(pruned_anywhere.numel(), device=factor.device)
    pruned_and_rows = [((~mask).nonzero().squeeze(1), rows) for mask, rows in _rows_by_mask(kept)]
    pieces = [(pruned, rows) for pruned, rows in pruned_and_rows if pruned.numel()]

    def solve(piece: int) -> torch.Tensor:
        pruned, rows = pieces[piece]
        columns = inverse_columns[:, column_of[pruned]]  # H[:, E]
        solution = coefficients[:, rows]
        multipliers = torch.linalg.solve(columns[pruned], solution[pruned])  # H[E, E]^-1 x_E
        solution = solution - columns @ multipliers
        solution[pruned] = 0
        return solution

    n = factor.shape[0]
    costs = [float(pruned.numel() ** 3 + n * pruned.numel() * rows.numel()) for pruned, rows in pieces]
    for (_, rows), solution in zip(pieces, spread(costs, solve), strict=True):
        coefficients[:, rows] = solution
    return coefficients


def _masked_by_groups(system: torch.Tensor, rhs: torch.Tensor, kept: torch.Tensor, spread: Spread) -> torch.Tensor:
    """Each row over its kept inputs, one solve of the kept sub-system per distinct mask (a singular system)."""
    n = kept.shape[1]
    coefficients = torch.zeros_like(rhs)
    pieces = []
    for mask, rows in _rows_by_mask(kept):
        inputs = mask.nonzero().squeeze(1)
        if system.shape[0] > n:  # the intercept
            inputs = torch.cat([inputs, inputs.new_tensor([n])])
        if inputs.numel():
            pieces.append((inputs, rows))

    def solve(piece: int) -> torch.Tensor:
        inputs, rows = pieces[piece]
        return _solve(system[inputs][:, inputs], rhs[inputs][:, rows])

    costs = [float(inputs.numel() ** 3 + inputs.numel() ** 2 * rows.numel()) for inputs, rows in pieces]
    for (inputs, rows), solved in zip(pieces, spread(costs, solve), strict=True):
        coefficients[inputs.unsqueeze(1), rows.unsqueeze(0)] = solved
    return coefficients


def _rows_by_mask(kept: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per distinct row of ``kept`` (in ``torch.unique``'s order): that mask and the rows that have it."""
    masks, groups = torch.unique(kept, dim=0, return_inverse=True)
    return [(mask, (groups == group).nonzero().squeeze(1)) for group, mask in enumerate(masks)]


def _solve(system: torch.Tensor, rhs: torch.Tensor, factor: torch.Tensor | None = None) -> torch.Tensor:
    """``system^-1 rhs`` for a symmetric positive semi-definite system: Cholesky, or the least-norm solution.

    ``factor``: the system's Cholesky factor, where it was made already.
    """
    if factor is None:
        factor, info = torch.linalg.cholesky_ex(system)
        if int(info) != 0:
            return torch.linalg.lstsq(system, rhs, driver="gelsd" if system.device.type == "cpu" else None).solution
    return torch.cholesky_solve(rhs, factor)
