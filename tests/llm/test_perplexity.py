"""prunereg.perplexity: exp of the mean next-token NLL over non-overlapping windows."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional

import prunereg


class _Bigram(nn.Module):
    """Logits from the previous token only, so each window's NLL can be written out by hand."""

    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Embedding(vocab, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids)


def _by_hand(model: _Bigram, tokens: torch.Tensor, window: int) -> float:
    nll, count = 0.0, 0
    for start in range(0, tokens.numel(), window):
        piece = tokens[start : start + window]
        if piece.numel() < 2:
            continue
        log_probs = functional.log_softmax(model.table.weight[piece[:-1]], dim=-1)
        nll -= log_probs.gather(1, piece[1:, None]).sum().item()
        count += piece.numel() - 1
    return math.exp(nll / count)


@pytest.mark.parametrize(("n_tokens", "window", "batch_size"), [(48, 8, 4), (50, 8, 2), (49, 8, 3), (7, 16, 1)])
def test_perplexity_is_the_mean_nll_over_windows_read_separately(n_tokens, window, batch_size):
    model = _Bigram()
    tokens = torch.randint(0, 11, (n_tokens,), generator=torch.Generator().manual_seed(2))
    expected = _by_hand(model, tokens, window)
    assert prunereg.perplexity(model, tokens, window=window, batch_size=batch_size) == pytest.approx(expected)
    assert prunereg.perplexity(model, tokens[None], window=window) == pytest.approx(expected)


def test_uniform_predictions_have_the_vocabulary_size_as_perplexity():
    model = _Bigram(vocab=7)
    nn.init.zeros_(model.table.weight)
    assert prunereg.perplexity(model, torch.arange(40) % 7, window=10) == pytest.approx(7.0)


def test_a_hugging_face_model_matches_its_own_loss():
    pytest.importorskip("transformers")
    from tests.support.tiny_lm import calibration_ids, tiny_llama

    model, ids = tiny_llama(), calibration_ids(3, 16)
    with torch.no_grad():
        losses = [model(row[None], labels=row[None]).loss.item() for row in ids]
    expected = math.exp(sum(losses) / len(losses))
    assert prunereg.perplexity(model, ids.reshape(-1), window=16) == pytest.approx(expected, rel=1e-5)
    assert not model.training


def test_each_modules_train_or_eval_flag_is_as_it_was_after():
    """A model training with a frozen part (a norm kept in eval mode, say) is handed back exactly so."""
    model = nn.Sequential(_Bigram(), nn.Dropout(0.5), nn.Identity())
    model.train()
    model[2].eval()
    flags = [module.training for module in model.modules()]
    prunereg.perplexity(model, torch.arange(12) % 11, window=6)
    assert [module.training for module in model.modules()] == flags


@pytest.mark.parametrize(
    ("ids", "kwargs", "error"),
    [
        (torch.rand(10), {}, TypeError),
        (torch.tensor([1]), {}, ValueError),
        (torch.arange(10), {"window": 1}, ValueError),
        (torch.arange(10), {"batch_size": 0}, ValueError),
    ],
)
def test_bad_arguments_raise(ids, kwargs, error):
    with pytest.raises(error):
        prunereg.perplexity(_Bigram(), ids, **kwargs)
