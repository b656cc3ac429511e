"""Damped least squares from normal equations: the solve that ``refit`` and ``replace`` share.

For a fit ``[X 1] [W^T; b] ~ R`` with statistics ``G = [X 1]^T [X 1]`` and
``C = [X 1]^T R`` (float64, :class:`prunereg.NormalEquations`), the solution of
``(G + D) [W^T; b] = C`` minimises ``||[X 1][W^T; b] - R||^2 + lambda ||W||^2``,
where ``D`` adds ``lambda = ridge * mean(diag(X^T X))`` to the diagonal of the
inputs only: the intercept ``b`` is not damped. On a masked model each output
row ``r`` is solved over its kept inputs alone (the others stay zero), rows of
the same mask together.
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
    if kept is None:
        coefficients = _solve(system, rhs)
    else:
        coefficients = torch.zeros_like(rhs)
        masks, groups = torch.unique(kept.to(torch.bool), dim=0, return_inverse=True)
        for group, mask in enumerate(masks):
            rows = (groups == group).nonzero().squeeze(1).to(rhs.device)
            inputs = mask.nonzero().squeeze(1).to(rhs.device)
            if intercept:
                inputs = torch.cat([inputs, inputs.new_tensor([n])])
            if inputs.numel():
                solved = _solve(system[inputs][:, inputs], rhs[inputs][:, rows])
                coefficients[inputs.unsqueeze(1), rows.unsqueeze(0)] = solved
    weight = coefficients[:n].T.contiguous()
    return weight, (coefficients[n].clone() if intercept else None)


def _solve(system: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """``system^-1 rhs`` for a symmetric positive semi-definite system: Cholesky, or the least-norm solution."""
    factor, info = torch.linalg.cholesky_ex(system)
    if int(info) == 0:
        return torch.cholesky_solve(rhs, factor)
    return torch.linalg.lstsq(system, rhs, driver="gelsd" if system.device.type == "cpu" else None).solution
