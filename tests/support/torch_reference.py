"""What prunereg is compared with: torch.nn.utils.prune's class for each built-in method name."""

from __future__ import annotations

import torch.nn.utils.prune as torch_prune

TORCH_CLASSES = {
    "identity": torch_prune.Identity,
    "random_unstructured": torch_prune.RandomUnstructured,
    "l1_unstructured": torch_prune.L1Unstructured,
    "random_structured": torch_prune.RandomStructured,
    "ln_structured": torch_prune.LnStructured,
}
