"""Pruned models in the stack users run: torch.compile/export, Lightning, quantization, torch's own pruning."""
