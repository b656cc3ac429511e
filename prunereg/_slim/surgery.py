"""Cutting indices out of a module's tensors, with the module's shape attributes kept true.

Everything that makes a model physically smaller (``prunereg.slim`` and
``prunereg.shrink``) removes channels through :func:`keep_indices`, then calls
:func:`sync_shape_attributes` so ``in_features``, ``out_channels``,
``normalized_shape`` and the like describe the new tensors, and the module's
``extra_repr``, ``state_dict`` reloading and any code reading those attributes
stay right.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def keep_indices(module: nn.Module, tensor_name: str, dim: int, keep: Tensor) -> None:
    """Keep only the entries ``keep`` (sorted, unique indices) of ``module.<tensor_name>`` along ``dim``.

    A parameter stays a parameter (``requires_grad`` kept) and a buffer a buffer;
    a missing or ``None`` tensor (a bias-free layer) is left alone. The old tensor
    is not modified, so a caller that must restore the model on an error can keep it.
    """
    tensor = getattr(module, tensor_name, None)
    if tensor is None:
        return
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{type(module).__name__}.{tensor_name} is not a tensor")
    if not -tensor.dim() <= dim < tensor.dim():
        raise IndexError(f"{type(module).__name__}.{tensor_name} has {tensor.dim()} dims; cannot cut dim {dim}")
    index = keep.to(dtype=torch.long)
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= tensor.shape[dim]):
        owner = f"{type(module).__name__}.{tensor_name}"
        raise IndexError(f"indices to keep lie outside {owner}'s dim {dim} of size {tensor.shape[dim]}")
    cut = tensor.detach().index_select(dim, index.to(tensor.device))
    if isinstance(tensor, nn.Parameter):
        setattr(module, tensor_name, nn.Parameter(cut, requires_grad=tensor.requires_grad))
    elif tensor_name in module._buffers:
        module._buffers[tensor_name] = cut
    else:
        setattr(module, tensor_name, cut)


def sync_shape_attributes(module: nn.Module) -> None:
    """Set ``module``'s size attributes from its (already cut) tensors.

    Covers ``nn.Linear``, convolutions (plain and transposed; ``groups`` must be set
    by the caller first when a depthwise layer loses channels), batch, instance,
    group, layer and RMS norms, embeddings, PReLU and GPT-2's ``Conv1D``. Other modules
    are left as they are.
    """
    weight = getattr(module, "weight", None)
    if isinstance(module, nn.Linear):
        module.out_features, module.in_features = module.weight.shape
    elif isinstance(module, nn.modules.conv._ConvNd):
        first, second = module.weight.shape[:2]
        if module.transposed:
            module.in_channels, module.out_channels = first, second * module.groups
        else:
            module.out_channels, module.in_channels = first, second * module.groups
    elif isinstance(module, (nn.modules.batchnorm._NormBase)):
        module.num_features = _channels_of(module, "running_mean")
    elif isinstance(module, nn.GroupNorm):
        if weight is not None:
            module.num_channels = weight.shape[0]
    elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        if weight is not None:
            module.normalized_shape = tuple(weight.shape)
    elif isinstance(module, nn.Embedding):
        module.num_embeddings, module.embedding_dim = module.weight.shape
    elif isinstance(module, nn.PReLU):
        module.num_parameters = int(module.weight.shape[0])
    elif type(module).__name__ == "Conv1D" and isinstance(weight, Tensor) and weight.dim() == 2:
        nx, nf = weight.shape
        setattr(module, "nx", int(nx))  # noqa: B010 - Conv1D is not typed here
        setattr(module, "nf", int(nf))  # noqa: B010


def _channels_of(module: nn.modules.batchnorm._NormBase, buffer_name: str) -> int:
    for name in ("weight", buffer_name):
        tensor = getattr(module, name, None)
        if isinstance(tensor, Tensor):
            return int(tensor.shape[0])
    return int(module.num_features)
