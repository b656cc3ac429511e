"""The parts of a Llama-style causal LM that a rotation of its residual stream touches, checked before any change.

The residual stream is read through RMS norms (each followed by the linears that
read it: q/k/v after ``input_layernorm``, gate/up after ``post_attention_layernorm``,
the output head after the final norm) and written by the embedding and each
block's ``o_proj`` and ``down_proj``. Anything else (a LayerNorm with a mean to
subtract, a bias on a norm, a linear that reads the stream elsewhere) would not
commute with a rotation, so such a model is refused with a one-line ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

import prunereg

_READERS = {
    "input_layernorm": ("self_attn", ("q_proj", "k_proj", "v_proj")),
    "post_attention_layernorm": ("mlp", ("gate_proj", "up_proj")),
}
_WRITERS = (("self_attn", "o_proj"), ("mlp", "down_proj"))


@dataclass(frozen=True)
class NormGroup:
    """An RMS norm that reads the residual stream and the linears that read its output."""

    name: str
    norm: nn.Module
    weight: nn.Parameter
    readers: tuple[tuple[str, nn.Linear], ...]

    @property
    def epsilon(self) -> float:
        value: float = getattr(self.norm, "variance_epsilon")  # noqa: B009 (checked a float by residual_parts)
        return value


@dataclass(frozen=True)
class ResidualParts:
    """Everything that reads or writes the residual stream of a Llama-style model, by qualified name."""

    hidden_size: int
    embedding: nn.Embedding
    norms: tuple[NormGroup, ...]
    writers: tuple[tuple[str, nn.Linear], ...]
    head: nn.Linear
    #: Whether the output head shares the input embedding's weight (found before anything changes).
    tied: bool


def residual_parts(model: nn.Module) -> ResidualParts:
    """The parts of ``model`` (a ``LlamaForCausalLM``-style model) around its residual stream; a ValueError if not."""
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None)
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if not isinstance(hidden, int) or not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ValueError(
            f"rotate needs a Llama-style causal LM (config.hidden_size, decoder blocks at model.model.layers); "
            f"{type(model).__name__} is not one"
        )
    if prunereg.is_pruned(model):
        raise ValueError("rotate needs plain weights: make the model's pruning permanent first (prunereg.remove)")
    embedding = _typed(
        getattr(model, "get_input_embeddings", _none)(), nn.Embedding, "the input embedding", hidden, dim=1
    )
    head = _typed(
        getattr(model, "get_output_embeddings", _none)(), nn.Linear, "the output head (lm_head)", hidden, dim=1
    )
    norms, writers = [], []
    for index, block in enumerate(layers):
        prefix = f"model.layers.{index}"
        for norm_name, (part, names) in _READERS.items():
            norm, weight = _rms_norm(getattr(block, norm_name, None), f"{prefix}.{norm_name}", hidden)
            holder = getattr(block, part, None)
            readers = tuple(
                (f"{prefix}.{part}.{name}", _linear(holder, name, f"{prefix}.{part}", hidden, dim=1)) for name in names
            )
            norms.append(NormGroup(f"{prefix}.{norm_name}", norm, weight, readers))
        for part, name in _WRITERS:
            writer = _linear(getattr(block, part, None), name, f"{prefix}.{part}", hidden, dim=0)
            writers.append((f"{prefix}.{part}.{name}", writer))
    final, weight = _rms_norm(getattr(base, "norm", None), "model.norm", hidden)
    norms.append(NormGroup("model.norm", final, weight, (("lm_head", head),)))
    return ResidualParts(hidden, embedding, tuple(norms), tuple(writers), head, head.weight is embedding.weight)


def _none() -> None:
    return None


def _linear(holder: nn.Module | None, name: str, where: str, hidden: int, *, dim: int) -> nn.Linear:
    return _typed(getattr(holder, name, None), nn.Linear, f"{where}.{name}", hidden, dim=dim)


_Module = TypeVar("_Module", bound=nn.Module)


def _typed(module: object, kind: type[_Module], what: str, hidden: int, *, dim: int) -> _Module:
    if not isinstance(module, kind):
        raise ValueError(f"rotate needs {what} to be a torch.nn.{kind.__name__}, not {type(module).__name__}")
    weight = module.weight
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[dim] != hidden:
        raise ValueError(f"rotate needs {what} to have {hidden} (hidden_size) features along dim {dim}")
    return module


def _rms_norm(module: object, where: str, hidden: int) -> tuple[nn.Module, nn.Parameter]:
    """``module`` and its weight, if it is an RMS norm: a weight of ``hidden`` entries, a ``variance_epsilon``."""
    weight = getattr(module, "weight", None)
    if not (
        isinstance(module, nn.Module)
        and "RMSNorm" in type(module).__name__
        and isinstance(getattr(module, "variance_epsilon", None), float)
        and getattr(module, "bias", None) is None
        and isinstance(weight, nn.Parameter)
        and tuple(weight.shape) == (hidden,)
    ):
        raise ValueError(
            f"rotate needs {where} to be an RMS norm with a weight of {hidden} entries and a variance_epsilon "
            f"(a LayerNorm's mean does not commute with a rotation), not {type(module).__name__}"
        )
    return module, weight
