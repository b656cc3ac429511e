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
"""

from __future__ import annotations

import torch

from prunereg import NormalEquations


def damped_solution(
    equations: NormalEquations, *, ridge: float, intercept: bool, kept: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The damped least-squares ``weight`` (``[out, in]``) and ``bias`` (``[out]``, None without intercept), float64.

    ``kept`` (bool ``[out, in]``): the inputs each output row may use; a weight
    outside it is exactly zero.
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
        coefficients = _masked_by_correction(factor, rhs, kept.to(device=rhs.device, dtype=torch.bool))
    else:
        coefficients = _masked_by_groups(system, rhs, kept.to(device=rhs.device, dtype=torch.bool))
    weight = coefficients[:n].T.contiguous()
    return weight, (coefficients[n].clone() if intercept else None)


def _masked_by_correction(factor: torch.Tensor, rhs: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
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
    masks, groups = torch.unique(kept, dim=0, return_inverse=True)
    for group, mask in enumerate(masks):
        pruned = (~mask).nonzero().squeeze(1)
        if not pruned.numel():
            continue
        rows = (groups == group).nonzero().squeeze(1)
        columns = inverse_columns[:, column_of[pruned]]  # H[:, E]
        solution = coefficients[:, rows]
        multipliers = torch.linalg.solve(columns[pruned], solution[pruned])  # H[E, E]^-1 x_E
        solution = solution - columns @ multipliers
        solution[pruned] = 0
        coefficients[:, rows] = solution
    return coefficients


def _masked_by_groups(system: torch.Tensor, rhs: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Each row over its kept inputs, one solve of the kept sub-system per distinct mask (a singular system)."""
    n = kept.shape[1]
    coefficients = torch.zeros_like(rhs)
    masks, groups = torch.unique(kept, dim=0, return_inverse=True)
    for group, mask in enumerate(masks):
        rows = (groups == group).nonzero().squeeze(1)
        inputs = mask.nonzero().squeeze(1)
        if system.shape[0] > n:  # the intercept
            inputs = torch.cat([inputs, inputs.new_tensor([n])])
        if inputs.numel():
            solved = _solve(system[inputs][:, inputs], rhs[inputs][:, rows])
            coefficients[inputs.unsqueeze(1), rows.unsqueeze(0)] = solved
    return coefficients


def _solve(system: torch.Tensor, rhs: torch.Tensor, factor: torch.Tensor | None = None) -> torch.Tensor:
    """``system^-1 rhs`` for a symmetric positive semi-definite system: Cholesky, or the least-norm solution.

    ``factor``: the system's Cholesky factor, where it was made already.
    """
    if factor is None:
        factor, info = torch.linalg.cholesky_ex(system)
        if int(info) != 0:
            return torch.linalg.lstsq(system, rhs, driver="gelsd" if system.device.type == "cpu" else None).solution
    return torch.cholesky_solve(rhs, factor)
