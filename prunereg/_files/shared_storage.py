"""Tied tensors: one tensor saved under several names, pruned once and written back still shared.

``torch.save`` writes a tensor that a state dict holds under two names (an LM
head tied to its embedding, say) once, and ``torch.load`` gives both names the
same storage back. Pruned name by name, the two would come apart: two copies,
and with a random method two different masks. Here such names form a group
that is pruned once, under its first name, and the result is written under
every name, so the file keeps the sharing. Only names that are the same view
(same storage, offset, shape, strides and dtype) are a group; tensors that
merely overlap are pruned and written separately.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping

import torch


def tied_names(tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Each name whose tensor is the same view as an earlier name's, mapped to that first name."""
    first_names: dict[tuple[object, ...], str] = {}
    tied: dict[str, str] = {}
    for name, tensor in tensors.items():
        if tensor.numel() == 0 or tensor.device.type == "meta":  # no storage that could be shared
            continue
        view = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tensor.stride(),
            tensor.dtype,
        )
        first = first_names.setdefault(view, name)
        if first != name:
            tied[name] = first
    return tied


def first_names(names: Iterable[str], tied: Mapping[str, str]) -> list[str]:
    """``names`` with each tied name replaced by its group's first name, each group once, in order."""
    return list(dict.fromkeys(tied.get(name, name) for name in names))


def tie(results: MutableMapping[str, torch.Tensor], tied: Mapping[str, str], *, copies: bool = False) -> None:
    """Give every tied name the result of its group's first name (the same tensor, or a copy if ``copies``)."""
    for name, first in tied.items():
        if first in results:
            results[name] = results[first].clone() if copies else results[first]
