"""State dicts shaped like real models' (names, order, ranks), with tiny tensors."""

from __future__ import annotations

import torch


def minilm_like(layers: int = 6, hidden: int = 4) -> dict[str, torch.Tensor]:
    """The names, order and ranks of an all-MiniLM-L6-v2 / BERT state dict, with tiny sizes; the same on each call."""
    generator = torch.Generator().manual_seed(layers)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator)

    tensors = {
        "embeddings.position_ids": torch.arange(8).unsqueeze(0),
        "embeddings.word_embeddings.weight": randn(30, hidden),
        "embeddings.position_embeddings.weight": randn(8, hidden),
        "embeddings.token_type_embeddings.weight": randn(2, hidden),
        "embeddings.LayerNorm.weight": torch.ones(hidden),
        "embeddings.LayerNorm.bias": torch.zeros(hidden),
    }
    for layer in range(layers):
        prefix = f"encoder.layer.{layer}."
        for name in (
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
            "intermediate.dense",
            "output.dense",
        ):
            tensors[prefix + name + ".weight"] = randn(hidden, hidden)
            tensors[prefix + name + ".bias"] = torch.zeros(hidden)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            tensors[prefix + name + ".weight"] = torch.ones(hidden)
            tensors[prefix + name + ".bias"] = torch.zeros(hidden)
    tensors["pooler.dense.weight"] = randn(hidden, hidden)
    tensors["pooler.dense.bias"] = torch.zeros(hidden)
    return tensors


ENCODER_MATRICES = [
    f"encoder.layer.{layer}.{name}.weight"
    for layer in range(6)
    for name in (
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
        "attention.output.dense",
        "intermediate.dense",
        "output.dense",
    )
]
