"""A model folder's ``config.json`` checked against its weight files' headers, before any model is built.

A config is a recipe for memory: ``num_hidden_layers: 1000000000`` would have
transformers build a billion blocks, ``hidden_size: 2**40`` allocate terabytes.
Two checks, each refusing in one line that names the key and what the weights
hold:

- :func:`check_config`, on the JSON before transformers reads it: no count of
  blocks above the weights' count of tensors, no width above their widest
  dimension (or count of tensors, for the counts of heads and experts). This
  bounds what building the model costs, not yet whether it fits;
- :func:`check_model`, on the model built on the meta device (no weight
  allocated): every tensor the weights hold under a name the model has must
  have the model's shape, and every numbered block the model has (``model.layers.7``)
  must be in the weights, so the model transformers loads is the one they hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from torch import nn

from prunereg._disk.model_dir import WeightHeaders

LAYER_KEYS = (
    "num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers", "encoder_layers",
    "decoder_layers",
)  # fmt: skip
"""Keys that count blocks."""
WIDTH_KEYS = (
    "hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "ffn_dim", "d_ff", "vocab_size",
    "head_dim", "moe_intermediate_size", "shared_expert_intermediate_size", "num_attention_heads",
    "num_key_value_heads", "n_head", "num_heads", "num_experts", "num_local_experts",
)  # fmt: skip
"""Keys that give a width, or a count of heads or experts (a dimension of a tensor, or a count of them)."""
_NUMBERED = re.compile(r"\.(\d+)(?=\.|$)")
_FIX = "use the config.json that came with these weights"


def check_config(config: Mapping[str, Any], weights: WeightHeaders, label: str) -> None:
    """Refuse a count or width in ``config`` (``config.json`` as read) that no model these weights hold has."""
    n_tensors = len(weights.tensors)
    widest = max((size for entry in weights.tensors.values() for size in entry.shape), default=0)
    for key, value in _settings(config, LAYER_KEYS):
        if value > n_tensors:
            raise ValueError(
                f"{label}'s config.json gives {key} {value}, but {weights.source} holds {_blocks(weights.tensors)} "
                f"in {n_tensors} tensors; {_advice([(key, value)])}"
            )
    for key, value in _settings(config, WIDTH_KEYS):
        if value > max(widest, n_tensors):
            raise ValueError(
                f"{label}'s config.json gives {key} {value}, but no tensor in {weights.source} is that large (the "
                f"largest dimension is {widest}); {_advice([(key, value)])}"
            )


def check_model(model: nn.Module, config: Mapping[str, Any], weights: WeightHeaders, label: str) -> None:
    """Refuse ``model`` (built from ``config`` on the meta device) where its tensors differ from the weights'.

    Only the names the weights and the model share are compared, and only the
    numbered blocks both have: a checkpoint transformers renames on loading
    (legacy or fused names) is left to transformers.
    """
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    names = checkpoint_names(model, weights.tensors)
    for name, shape in shapes.items():  # in the model's order: the embedding before the head
        held = weights.tensors[names[name]].shape if name in names else shape
        if held != shape:
            raise ValueError(_shape_refusal(config, name, shape, held, weights.source, label))
    held_blocks = _numbered(names)
    for prefix, indices in _numbered(shapes).items():
        blocks = held_blocks.get(prefix)
        if blocks is not None and not indices <= blocks:
            keys = [(key, value) for key, value in _settings(config, LAYER_KEYS) if value == len(indices)]
            says = _gives(keys) if keys else f"makes {len(indices)} blocks of {prefix}"
            raise ValueError(
                f"{label}'s config.json {says}, but {weights.source} holds {_span(prefix, blocks)}; {_advice(keys)}"
            )


def checkpoint_names(model: nn.Module, checkpoint_keys: Iterable[str]) -> dict[str, str]:
    """Model state-dict name -> checkpoint key; checkpoints may leave out the base model's prefix (GPT-2)."""
    model_names = set(model.state_dict())
    prefix = getattr(model, "base_model_prefix", "")
    names = {}
    for key in checkpoint_keys:
        if key in model_names:
            names[key] = key
        elif prefix and f"{prefix}.{key}" in model_names:
            names[f"{prefix}.{key}"] = key
    return names


def _settings(config: Mapping[str, Any], keys: Iterable[str]) -> Iterator[tuple[str, int]]:
    """``(key, value)`` of the integer settings named ``keys``, at the top and in sub-configs (``text_config.x``)."""
    wanted = set(keys)
    for key, value in config.items():
        if isinstance(value, Mapping):
            for sub_key, sub_value in value.items():
                if sub_key in wanted and type(sub_value) is int:
                    yield f"{key}.{sub_key}", sub_value
        elif key in wanted and type(value) is int:
            yield key, value


def _numbered(names: Iterable[str]) -> dict[str, set[int]]:
    """For each numbered list in ``names`` (``model.layers`` of ``model.layers.3.mlp``), the indices present."""
    lists: dict[str, set[int]] = {}
    for name in names:
        for found in _NUMBERED.finditer(name):
            lists.setdefault(name[: found.start()], set()).add(int(found.group(1)))
    return lists


def _blocks(tensors: Mapping[str, object]) -> str:
    """The weights' longest list of blocks, as a message gives it: ``2 blocks (model.layers.0 to model.layers.1)``."""
    lists = _numbered(tensors)
    outer = {prefix: indices for prefix, indices in lists.items() if not _NUMBERED.search(prefix)} or lists
    if not outer:
        return "no numbered blocks"
    prefix = max(outer, key=lambda p: (len(outer[p]), -len(p)))
    return _span(prefix, outer[prefix])


def _span(prefix: str, indices: set[int]) -> str:
    count = f"{len(indices)} block{'s' * (len(indices) != 1)}"
    return f"{count} ({prefix}.{min(indices)} to {prefix}.{max(indices)})"


def _shape_refusal(
    config: Mapping[str, Any], name: str, wanted: tuple[int, ...], held: tuple[int, ...], source: str, label: str
) -> str:
    same_rank = len(wanted) == len(held)
    differing = {size for size, other in zip(wanted, held, strict=False) if size != other} if same_rank else set(wanted)
    keys = [(key, value) for key, value in _settings(config, WIDTH_KEYS) if value in differing]
    holds = f"{source} holds {name} as {list(held)}"
    if not keys:
        return f"{label}'s config.json makes {name} {list(wanted)}, but {holds}; {_advice(keys)}"
    return f"{label}'s config.json {_gives(keys)}, but {holds}, not {list(wanted)}; {_advice(keys)}"


def _gives(keys: list[tuple[str, int]]) -> str:
    return "gives " + " and ".join(f"{key} {value}" for key, value in keys)


def _advice(keys: list[tuple[str, int]]) -> str:
    """What to do: fix the one key at fault, or take the config that came with the weights."""
    return f"fix {keys[0][0]} or {_FIX}" if len(keys) == 1 else _FIX
