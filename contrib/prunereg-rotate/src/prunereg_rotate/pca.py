"""The principal directions of a model's residual stream, from its RMS norms' inputs on calibration tokens.

Every reader of the residual stream sees it through an RMS norm, which divides
each token's vector ``x`` by its length: what a reader loses when the stream is
cut to ``k`` directions is the share of ``x / ||x||`` outside them. So the
covariance summed here is that of the unit vectors ``x / ||x||`` at every
norm's input (each block's two norms and the final one), and the basis that
loses least is its leading eigenvectors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from prunereg_rotate.parts import ResidualParts


def residual_covariance(
    model: nn.Module, parts: ResidualParts, ids: torch.Tensor, batch_size: int
) -> tuple[torch.Tensor, int]:
    """``sum u u^T`` over every token at every norm's input, ``u = x / ||x||`` (float64 ``[d, d]``), and the count."""
    covariance = torch.zeros(parts.hidden_size, parts.hidden_size, dtype=torch.float64)
    seen = [0]

    def observe(_: nn.Module, args: tuple[Any, ...]) -> None:
        rows = args[0].detach().reshape(-1, parts.hidden_size).double().cpu()
        lengths = rows.norm(dim=1, keepdim=True)
        units = rows[lengths.squeeze(1) > 0] / lengths[lengths.squeeze(1) > 0]
        covariance.addmm_(units.T, units)
        seen[0] += units.shape[0]

    device = parts.embedding.weight.device
    options = {"use_cache": False} if hasattr(getattr(model, "config", None), "use_cache") else {}
    with torch.no_grad(), _hooked([group.norm for group in parts.norms], observe):
        for batch in torch.split(ids, batch_size):
            model(batch.to(device), **options)
    return covariance, seen[0]


def principal_basis(covariance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eigenvectors of ``covariance`` as columns, largest eigenvalue first, and those eigenvalues (float64).

    Each vector's sign is fixed (its entry of largest magnitude positive) so the
    same statistics always give the same rotation.
    """
    values, vectors = torch.linalg.eigh(covariance.double())
    values, vectors = values.flip(0), vectors.flip(1)
    largest = vectors.abs().argmax(dim=0)
    signs = vectors[largest, torch.arange(vectors.shape[1])].sign()
    return vectors * torch.where(signs == 0, 1.0, signs), values.clamp(min=0)


@contextlib.contextmanager
def _hooked(modules: list[nn.Module], hook: Any) -> Iterator[None]:
    handles = [module.register_forward_pre_hook(hook) for module in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
