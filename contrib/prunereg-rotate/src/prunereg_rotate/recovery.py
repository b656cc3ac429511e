"""``channel_affine``: a scale and a shift per output channel of each block's writer projections.

Between leaving a cut block alone and refitting its writers' whole weight
matrices (the built-in ``refit``), this fits two numbers per output channel
of ``o_proj`` and ``down_proj``: ``y_o <- a_o * y_o + c_o``. The scale fixes
the energy a cut removed, the shift the mean it removed (FLAP's bias
compensation is the shift alone); with so few parameters a small calibration
set cannot overfit, and every zero of a pruned weight stays zero by
construction (a row is only scaled).
"""

from __future__ import annotations

import torch
from torch import nn

from prunereg import NormalEquations, RecoveryBlock, RecoveryMethod

#: The writers in the order they are fitted: the MLP reads what the attention writes.
KINDS = ("attention", "mlp")


class ChannelAffine(RecoveryMethod):
    """Per output channel ``o`` of each writer, the least-squares ``a_o``, ``c_o`` of ``a_o * y_o + c_o ~ r_o``.

    ``y_o`` is the channel's output on the calibration tokens along the
    recovered model's trajectory, ``r_o`` what it must write for the block to
    give the dense model's output (from :meth:`prunereg.RecoveryBlock.normal_equations`,
    so no token is kept). The row is scaled by ``a_o``; the bias becomes
    ``a_o * b_o + c_o``, switched on where the config can (``mlp_bias``,
    ``attention_bias``); with ``bias=False`` (or a writer without a bias) only
    the scale is fitted. The attention's ``o_proj`` is fitted only where the
    attention is no longer the dense one; the MLP's ``down_proj`` always.
    """

    STATISTICS = frozenset({"attention_residual"})

    def __init__(self, bias: bool = True) -> None:
        if not isinstance(bias, bool):
            raise TypeError(f"bias must be True or False, not {bias!r}")
        self.bias = bias

    def __repr__(self) -> str:
        return f"ChannelAffine(bias={self.bias})"

    @property
    def writer_biases(self) -> frozenset[str]:
        return frozenset(KINDS) if self.bias else frozenset()

    def recover_block(self, block: RecoveryBlock) -> str | None:
        fitted = []
        for kind in KINDS:
            if kind == "attention" and kind not in block.changed:
                continue  # the dense attention's own weights: its outputs are already the teacher's map
            writer = block.writer(kind)
            if not isinstance(writer, nn.Linear):
                continue
            scale, shift = affine_fit(block.normal_equations(kind), writer.weight, writer.bias)
            with torch.no_grad():
                writer.weight.mul_(scale.to(writer.weight).unsqueeze(1))
                if writer.bias is not None and shift is not None:
                    writer.bias.copy_((scale * writer.bias.double() + shift).to(writer.bias))
            fitted.append(f"{kind} ({'scale and shift' if shift is not None else 'scale'})")
        return f"fitted per channel: {', '.join(fitted)}" if fitted else "no writer to fit"


def affine_fit(
    equations: NormalEquations, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The least-squares scale (``[out]``) and shift (``[out]``, None without ``bias``) of each output, float64.

    With ``U = [W^T; b]`` the current coefficients, each output's sums are
    ``S_yy = u^T G u``, ``S_y1 = G_n u``, ``S_yr = u^T C``, ``S_1r = C_n`` and
    ``N = G_nn`` (``G``, ``C`` the normal equations, ``n`` the constant's index),
    and ``[[S_yy, S_y1], [S_y1, N]] [a; c] = [S_yr; S_1r]``. An output that is
    constant over the tokens keeps its scale (``a = 1``) and gets the mean shift.
    """
    gram, cross = equations.gram, equations.cross
    n = equations.n_inputs
    coefficients = torch.cat([weight.detach().double().T.to(gram.device), _row(bias, weight).to(gram.device)])
    s_yy = (coefficients * (gram @ coefficients)).sum(0)
    s_yr = (coefficients * cross).sum(0)
    if bias is None:
        return torch.where(s_yy > 0, s_yr / s_yy.clamp(min=torch.finfo(torch.float64).tiny), 1.0), None
    s_y1 = gram[n] @ coefficients
    s_1r, tokens = cross[n], gram[n, n]
    determinant = s_yy * tokens - s_y1.square()
    varying = determinant > 1e-12 * s_yy * tokens
    safe = torch.where(varying, determinant, 1.0)
    scale = torch.where(varying, (tokens * s_yr - s_y1 * s_1r) / safe, 1.0)
    shift = torch.where(varying, (s_yy * s_1r - s_y1 * s_yr) / safe, (s_1r - s_y1) / tokens)
    return scale, shift


def _row(bias: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
    if bias is None:
        return torch.zeros(1, weight.shape[0], dtype=torch.float64, device=weight.device)
    return bias.detach().double().reshape(1, -1)
