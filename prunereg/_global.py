"""Global pruning: one threshold over many tensors, as if they were one."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from prunereg import _reparam
from prunereg._container import combine_masks
from prunereg._method import BasePruningMethod
from prunereg_builtins.custom import CustomFromMask

if TYPE_CHECKING:
    from torch import nn

Parameter = tuple["nn.Module", str]


def global_unstructured(
    parameters: Iterable[Parameter],
    pruning_method: type[BasePruningMethod],
    importance_scores: dict[Parameter, torch.Tensor] | None = None,
    **kwargs: Any,
) -> None:
    """Prune ``parameters`` together with one ``"unstructured"`` method, as torch does.

    The method sees the entries of all tensors that are still unpruned as one
    vector; each tensor then gets its share of the mask through ``custom_from_mask``.
    Unlike torch, the tensors may live on different devices (meta included),
    ``parameters`` may be a generator, and no concatenated mask stays alive.
    """
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    importance_scores = importance_scores if importance_scores is not None else {}
    if not isinstance(importance_scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    parameters = list(parameters)
    if not (isinstance(pruning_method, type) and issubclass(pruning_method, BasePruningMethod)):
        raise TypeError(
            "global_unstructured(): pruning_method must be a BasePruningMethod subclass, "
            f"got {pruning_method!r}"
        )
    method = pruning_method(**kwargs)
    method._tensor_name = "temp"
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(
            'Only "unstructured" PRUNING_TYPE supported for the `pruning_method`. '
            f"Found method {pruning_method} of type {method.PRUNING_TYPE}"
        )
    if not parameters:
        # torch fails here too (ValueError from torch.cat); silently pruning
        # nothing would hide an exhausted generator.
        raise ValueError("global_unstructured(): parameters is empty")

    tensors = [getattr(module, name) for module, name in parameters]
    scores = [_scores_for(importance_scores, pair, t) for pair, t in zip(parameters, tensors)]
    masks = [getattr(module, name + "_mask", None) for module, name in parameters]
    new_masks = global_masks(method, tensors, scores, masks)
    installed = set()
    with _reparam.all_or_nothing(parameters):
        for (module, name), share in zip(parameters, new_masks):
            if (id(module), name) in installed:
                # Listed twice: like torch, keep the zeros of both shares.
                share = getattr(module, name + "_mask") * share
            installed.add((id(module), name))
            _reparam.install_mask(module, name, CustomFromMask(share), share)


def global_masks(
    method: BasePruningMethod,
    tensors: Sequence[torch.Tensor],
    scores: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor | None],
) -> list[torch.Tensor]:
    """Each tensor's final mask when ``method`` prunes ``tensors`` together, as one vector.

    ``scores`` rank the entries (the tensors themselves, or importance scores of
    their shapes); ``masks`` are the tensors' earlier masks (``None``: nothing
    pruned yet). Each mask returned has its tensor's shape, dtype and device.
    This is the tensor-level core of :func:`global_unstructured`, also used to
    prune a checkpoint's tensors without building a model.
    """
    device = tensors[0].device
    flat_scores = torch.cat([s.reshape(-1).to(device) for s in scores])
    flat_mask = torch.cat(
        [(m if m is not None else torch.ones_like(t)).reshape(-1).to(device, flat_scores.dtype) for m, t in zip(masks, tensors)]
    )
    final = combine_masks(method, flat_scores, flat_mask)
    del flat_scores, flat_mask

    shares = torch.split(final, [t.numel() for t in tensors])
    new_masks = []
    for t, old_mask, share in zip(tensors, masks, shares):
        share = share.reshape(t.shape).to(device=t.device, dtype=t.dtype, copy=True)
        new_masks.append(share if old_mask is None else old_mask.to(dtype=t.dtype) * share)
    del final, shares
    return new_masks


def _scores_for(importance_scores: dict[Parameter, torch.Tensor], pair: Parameter, tensor: torch.Tensor) -> torch.Tensor:
    """The scores of one parameter, in its shape.

    torch flattens every score tensor, so any shape with the parameter's number
    of entries is accepted; a different count is an IndexError, as it is in
    torch when the counts do not add up.
    """
    scores = importance_scores.get(pair)
    if scores is None:
        return tensor
    if scores.numel() != tensor.numel():
        raise IndexError(
            f"importance_scores for parameter {pair[1]} of {pair[0]} should have "
            f"{tensor.numel()} entries like the parameter, got shape {tuple(scores.shape)}"
        )
    return scores.reshape(tensor.shape)
