"""State dicts saved from pruned models, where ``<name>_orig`` and ``<name>_mask`` are one tensor ``<name>``.

A pruned parameter is kept as its original values and a mask, and the model
computes ``<name> = <name>_orig * <name>_mask`` (``torch.nn.utils.prune`` and
prunereg alike). The command line reports and prunes such a file by these
effective tensors, and writes a pruned pair back as a pair.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

ORIG = "_orig"
MASK = "_mask"


@dataclass(frozen=True)
class PrunedPair:
    """The two stored tensors behind one effective tensor."""

    orig_key: str
    mask_key: str


@dataclass(frozen=True)
class PrunedState:
    """A file's tensors as the model uses them, and where pruned ones are stored."""

    tensors: dict[str, torch.Tensor]
    """Every tensor by name, in file order; a pair as ``<name>``, the product, at its ``_orig``'s place."""
    pairs: dict[str, PrunedPair]
    """The pruned tensors' stored keys, by effective name."""
    masks: dict[str, torch.Tensor]
    """The pruned tensors' stored masks, by effective name."""

    @classmethod
    def of(cls, stored: Mapping[str, torch.Tensor]) -> PrunedState:
        """Find the pairs: a floating-point ``<name>_orig``, a ``<name>_mask`` of its shape, and no ``<name>``.

        Every other tensor is taken as it is.
        """
        pairs = {name: PrunedPair(name + ORIG, name + MASK) for name in _paired_names(stored)}
        mask_keys = {pair.mask_key for pair in pairs.values()}
        tensors: dict[str, torch.Tensor] = {}
        masks: dict[str, torch.Tensor] = {}
        for key, tensor in stored.items():
            name = key.removesuffix(ORIG)
            if name in pairs and key == pairs[name].orig_key:
                masks[name] = stored[pairs[name].mask_key]
                tensors[name] = masks[name].to(dtype=tensor.dtype) * tensor
            elif key not in mask_keys:
                tensors[key] = tensor
        return cls(tensors, pairs, masks)

    def stored_form(self, name: str, pruned: torch.Tensor, mask: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """What the file holds for ``name`` once pruned to ``pruned`` with ``mask``.

        A plain tensor is replaced by ``pruned``; a pair keeps its original
        values and gets the new mask in its old mask's dtype, as a re-pruned
        module's state dict has them.
        """
        pair = self.pairs.get(name)
        if pair is None or mask is None:
            return {name: pruned}
        old = self.masks[name]
        return {pair.mask_key: mask.to(dtype=old.dtype).contiguous()}


def _paired_names(stored: Mapping[str, torch.Tensor]) -> list[str]:
    found = []
    for key, orig in stored.items():
        if not key.endswith(ORIG):
            continue
        name = key.removesuffix(ORIG)
        mask = stored.get(name + MASK)
        if name and name not in stored and mask is not None and mask.shape == orig.shape and orig.is_floating_point():
            found.append(name)
    return found
