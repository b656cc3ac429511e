"""``rotate``: SliceGPT's rotation of a Llama-style model's residual stream, and slicing it to fewer dimensions.

Each RMS norm's weight is folded into the linears that read it (the norm
keeps a weight of ones), which makes every norm commute with an orthogonal
``Q``: ``norm(x Q) = norm(x) Q``. Then the embedding and every writer
(``o_proj``, ``down_proj``) write ``x Q`` and every reader (q/k/v, gate/up, the
output head) reads it, so the model computes exactly what it did. ``Q`` is the
principal basis of the normalized residual stream on calibration tokens
(:mod:`prunereg_rotate.pca`), so keeping its first ``k`` columns cuts the stream
to the ``k`` directions that carry most of it: ``hidden_size`` becomes ``k``, the
config says so (``head_dim`` written out, ``rms_norm_eps`` scaled so that the
norms divide by the same length), and stock ``from_pretrained`` reloads it.
One ``Q`` for the whole stream (SliceGPT uses one per block, with a matrix on
each residual connection that stock transformers cannot load).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from prunereg_rotate.parts import ResidualParts, residual_parts
from prunereg_rotate.pca import principal_basis, residual_covariance


@dataclass(frozen=True)
class RotationReport:
    """What :func:`rotate` did: the residual stream's width before and after, and what the kept directions carry.

    ``kept_energy`` is the share of the normalized residual stream (the sum of
    ``||x Q_k||^2 / ||x||^2`` over the calibration tokens at every norm) in the
    kept directions: 1.0 without slicing.
    """

    hidden_size_before: int
    hidden_size: int
    n_tokens: int
    kept_energy: float
    untied: bool

    def __str__(self) -> str:
        untied = "; the output head no longer shares the embedding's weight" if self.untied else ""
        return (
            f"rotated the residual stream by its principal directions on {self.n_tokens} token observations; "
            f"hidden size {self.hidden_size_before} -> {self.hidden_size}, "
            f"{self.kept_energy:.2%} of the normalized stream kept{untied}"
        )


def rotate(
    model: nn.Module, calibration: torch.Tensor, *, hidden_size: int | None = None, batch_size: int = 8
) -> RotationReport:
    """Rotate ``model``'s residual stream to its principal basis, in place, and keep its first ``hidden_size`` dims.

    ``model`` is a Llama-style causal LM (RMS norms; Llama, Mistral, Qwen2),
    ``calibration`` token ids (``[samples, seq_len]``, run ``batch_size`` samples
    at a time). Without ``hidden_size`` the outputs are unchanged up to float
    rounding; with it (``1 <= hidden_size <= config.hidden_size``) the model
    keeps that many directions of its residual stream. A tied output head gets a
    weight of its own (the final norm is folded into it, not into the
    embedding) and ``tie_word_embeddings`` becomes false. A model or argument it
    cannot handle is refused with a one-line error before anything changes.
    """
    parts = residual_parts(model)
    keep = _checked_size(hidden_size, parts.hidden_size)
    ids = _checked_ids(calibration, parts.embedding.num_embeddings)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, not {batch_size!r}")
    covariance, n_tokens = residual_covariance(model, parts, ids, batch_size)
    basis, energies = principal_basis(covariance)
    _rotate_parts(model, parts, basis[:, :keep])
    total = float(energies.sum())
    share = float(energies[:keep].sum()) / total if total else 1.0
    return RotationReport(parts.hidden_size, keep, n_tokens, share, parts.tied)


def rotate_by(model: nn.Module, basis: torch.Tensor) -> None:
    """Rotate ``model``'s residual stream by ``basis`` (``[hidden_size, k]``, orthonormal columns), in place.

    The stream ``x`` becomes ``x @ basis``: with a square orthogonal ``basis``
    the outputs are unchanged up to float rounding (any rotation: a random or
    Hadamard one, as QuaRot uses); with ``k`` columns the model keeps those
    directions, as :func:`rotate` does with the principal ones.
    """
    parts = residual_parts(model)
    if not isinstance(basis, torch.Tensor) or basis.dim() != 2 or basis.shape[0] != parts.hidden_size:
        raise ValueError(f"basis must be a [{parts.hidden_size}, k] tensor (hidden_size rows)")
    keep = _checked_size(int(basis.shape[1]), parts.hidden_size)
    gram = basis.double().T @ basis.double()
    if not torch.allclose(gram, torch.eye(keep, dtype=torch.float64), atol=1e-6):
        raise ValueError("basis must have orthonormal columns (basis.T @ basis == identity)")
    _rotate_parts(model, parts, basis.double())


def _rotate_parts(model: nn.Module, parts: ResidualParts, basis: torch.Tensor) -> None:
    writes = _rotated(parts, basis)  # every new tensor first: nothing changes if one fails
    for write in writes:
        write()
    _rewrite_config(getattr(model, "config"), parts, int(basis.shape[1]))  # noqa: B009 (checked by residual_parts)


def _checked_size(hidden_size: int | None, full: int) -> int:
    if hidden_size is None:
        return full
    if isinstance(hidden_size, bool) or not isinstance(hidden_size, int):
        raise TypeError(f"hidden_size must be an int, not {type(hidden_size).__name__}")
    if not 1 <= hidden_size <= full:
        raise ValueError(f"hidden_size must be between 1 and the model's {full}, not {hidden_size}")
    return hidden_size


def _checked_ids(calibration: object, vocabulary: int) -> torch.Tensor:
    if not isinstance(calibration, torch.Tensor) or calibration.dtype.is_floating_point or calibration.is_complex():
        raise TypeError(f"calibration must be a tensor of token ids, not {type(calibration).__name__}")
    ids = calibration.reshape(1, -1) if calibration.dim() == 1 else calibration
    if ids.dim() != 2 or ids.numel() == 0:
        raise ValueError(f"calibration must be token ids of shape [samples, seq_len], not {tuple(calibration.shape)}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocabulary:
        raise ValueError(f"calibration holds token ids outside the vocabulary [0, {vocabulary})")
    return ids.long()


def _rotated(parts: ResidualParts, basis: torch.Tensor) -> list[Callable[[], None]]:
    """The assignments that rotate (and slice) every part, computed in float64 but not yet made."""
    full, keep = basis.shape
    writes = [_replace(parts.embedding, "weight", _times(parts.embedding.weight, basis), embedding_dim=keep)]
    for group in parts.norms:
        # A norm over keep dims divides by sqrt(|x|^2 / keep + eps'): with eps' = eps * full / keep, times
        # sqrt(full / keep) (folded here) it is the norm over full dims of the same vector.
        gain = group.weight.detach().double() * math.sqrt(full / keep)
        for _, reader in group.readers:
            folded = reader.weight.detach().double() * gain.to(reader.weight.device)
            writes.append(_replace(reader, "weight", _times(folded, basis), in_features=keep))
        ones = torch.ones(keep, dtype=group.weight.dtype, device=group.weight.device)
        writes.append(_replace(group.norm, "weight", ones, variance_epsilon=group.epsilon * full / keep))
    for _, writer in parts.writers:
        writes.append(_replace(writer, "weight", _times(writer.weight.T, basis).T, out_features=keep))
        if writer.bias is not None:
            writes.append(_replace(writer, "bias", _times(writer.bias.unsqueeze(0), basis).squeeze(0)))
    return writes


def _times(tensor: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """``tensor @ basis`` in float64, on the tensor's device."""
    return tensor.detach().double() @ basis.to(tensor.device)


def _replace(module: nn.Module, name: str, value: torch.Tensor, **attributes: object) -> Callable[[], None]:
    """Setting ``module.<name>`` to ``value`` (in the old dtype, device and grad flag), and ``attributes``."""
    old = getattr(module, name)
    new = nn.Parameter(value.to(dtype=old.dtype, device=old.device).contiguous(), requires_grad=old.requires_grad)

    def write() -> None:
        setattr(module, name, new)
        for attribute, setting in attributes.items():
            setattr(module, attribute, setting)

    return write


def _rewrite_config(config: Any, parts: ResidualParts, keep: int) -> None:
    """The widths stock ``from_pretrained`` builds the rotated model with."""
    head_dim = getattr(config, "head_dim", None) or parts.hidden_size // config.num_attention_heads
    config.head_dim = head_dim
    config.rms_norm_eps = config.rms_norm_eps * parts.hidden_size / keep
    config.hidden_size = keep
    if parts.tied:
        config.tie_word_embeddings = False
