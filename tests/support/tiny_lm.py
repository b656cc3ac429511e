"""Tiny Hugging Face causal LMs built from configs (no download), and a deterministic calibrated method.

Tests that use them call ``pytest.importorskip("transformers")`` first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from prunereg import CalibratedMethod, LayerStatistics, PrunedWeight

VOCAB = 64


def tiny_llama(seed: int = 0, layers: int = 2, **overrides: object) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = {
        "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": layers,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
        "tie_word_embeddings": False, **overrides,
    }  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**config)).eval()


def tiny_mistral(seed: int = 0) -> nn.Module:
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    config = MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    return MistralForCausalLM(config).eval()


def tiny_gpt2(seed: int = 0) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128)).eval()


def tiny_opt(seed: int = 0) -> nn.Module:
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(seed)
    config = OPTConfig(
        vocab_size=VOCAB, hidden_size=32, ffn_dim=48, num_hidden_layers=2, num_attention_heads=4,
        word_embed_proj_dim=32, max_position_embeddings=128,
    )  # fmt: skip
    return OPTForCausalLM(config).eval()


def calibration_ids(samples: int = 6, length: int = 16, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (samples, length), generator=generator)


def score_prune(weight: torch.Tensor, scores: torch.Tensor, sparsity: float) -> PrunedWeight:
    """Zero the ``int(sparsity * in)`` lowest-scored entries of every row."""
    k = int(weight.shape[1] * sparsity)
    mask = torch.ones_like(weight, dtype=torch.bool)
    mask.scatter_(1, scores.argsort(dim=1)[:, :k], False)
    return PrunedWeight(weight * mask, mask)


class NormScore(CalibratedMethod):
    """Per row, prune the lowest ``|W| * sqrt(input_sq_norms)``, and remember every call (for the tests)."""

    STATISTICS = frozenset({"input_sq_norms", "hessian"})

    def __init__(self, sparsity: float = 0.5, pattern: str | None = None) -> None:
        super().__init__(sparsity, pattern)
        self.calls: list[tuple[list[torch.Tensor], LayerStatistics, list[float]]] = []

    def prune_group(
        self, weights: Sequence[torch.Tensor], statistics: LayerStatistics, sparsities: Sequence[float]
    ) -> list[PrunedWeight]:
        self.check_group(weights, statistics, sparsities)
        self.calls.append(([w.clone() for w in weights], statistics, list(sparsities)))
        assert statistics.input_sq_norms is not None
        norms = statistics.input_sq_norms.sqrt()
        return [score_prune(w, w.abs() * norms, s) for w, s in zip(weights, sparsities, strict=True)]


WORDS = [f"w{i}" for i in range(VOCAB - 1)]


def save_tiny_llama_folder(folder: object, seed: int = 0) -> None:
    """A tiny Llama and a word-level tokenizer over :data:`WORDS`, saved as a Hugging Face folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{word: i + 1 for i, word in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tiny_llama(seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def random_text(n_words: int, seed: int = 0) -> str:
    generator = torch.Generator().manual_seed(seed)
    return " ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (n_words,), generator=generator))
