"""Which checkpoint tensors make each tensor of a model, and how: read as they are, or converted as transformers does.

Most folders hold a model's tensors under its own names (at most without the
base model's prefix, as GPT-2's do). transformers 5 holds some tensors
otherwise in memory than on disk and converts on loading: a Mixtral or
Qwen3-MoE checkpoint stores every expert as modules of its own
(``experts.3.w1.weight``), which transformers stacks into one tensor per
projection (``experts.gate_up_proj``), and writes back apart on saving. A
folder read tensor by tensor (``prunereg shrink --stream``, ``slim
--stream``, ``oneshot_folder``) must do the same: :class:`CheckpointLayout`
asks transformers' own conversion tables which keys make which tensor, and
runs its converters, on meta tensors to plan, then on the tensors read; the
output is written back in the checkpoint's layout.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._disk.safetensors_file import DTYPE_CODES, TensorEntry
from prunereg._models.config_check import checkpoint_names


@dataclass(frozen=True)
class Converted:
    """Model tensors transformers makes of several checkpoint tensors (experts stacked, gate and up side by side)."""

    targets: tuple[str, ...]
    """The model names it makes."""
    keys: tuple[str, ...]
    """The checkpoint keys it reads, in the order transformers reads them."""
    patterns: tuple[str, ...]
    """Per key, the converter's source pattern it matched."""
    converter: Any
    """transformers' ``WeightConverter`` (a fresh copy runs each time)."""

    def run(self, tensors: Mapping[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
        """The model tensors this makes of ``tensors`` (checkpoint key to tensor), by model name."""
        converter = copy.deepcopy(self.converter)
        for key, pattern in zip(self.keys, self.patterns, strict=True):
            converter.add_tensor(self.targets[0], key, pattern, tensors[key])
        made = converter.convert(self.targets[0], model=model, config=getattr(model, "config", None))
        return {name: value[0] if isinstance(value, list) else value for name, value in made.items()}


class CheckpointLayout:
    """How a checkpoint's keys make ``model``'s tensors.

    ``plain`` maps a model name to the one key holding it (its own name, a
    name transformers renames on loading, or the name without the base model's
    prefix); ``converted`` maps each name a converter makes to that
    conversion.
    """

    def __init__(self, model: nn.Module, entries: Mapping[str, TensorEntry]) -> None:
        self.model: Any = model  # a transformers PreTrainedModel where anything is converted
        self.plain: dict[str, str] = checkpoint_names(model, entries)
        self.strips_prefix = any(name != key for name, key in self.plain.items())
        """Whether the checkpoint leaves out the base model's prefix (GPT-2's)."""
        self.converted: dict[str, Converted] = {}
        held = set(self.plain.values())
        left = [key for key in entries if key not in held]
        if left:
            self._convert(left, entries, model.state_dict())

    def names(self) -> set[str]:
        """The model names the checkpoint holds."""
        return {*self.plain, *self.converted}

    def used_keys(self) -> set[str]:
        """The checkpoint keys that make some model tensor."""
        return {*self.plain.values(), *(key for made in self.converted.values() for key in made.keys)}

    def together(self, name: str) -> list[str]:
        """The model names read and stored with ``name``: those its conversion makes, or ``name`` alone."""
        made = self.converted.get(name)
        return list(made.targets) if made is not None else [name]

    def key_of(self, name: str) -> str:
        """The key of model name ``name`` stored as it is; for a tensor the checkpoint does not hold (a new bias),
        the key the checkpoint would give it."""
        if name in self.plain:
            return self.plain[name]
        return name.partition(".")[2] if self.strips_prefix else name

    def keys_for(self, names: Iterable[str]) -> list[str]:
        """The checkpoint keys that make the model tensors ``names`` (each once)."""
        keys: dict[str, None] = {}
        for name in names:
            if name in self.plain:
                keys[self.plain[name]] = None
            elif name in self.converted:
                keys.update(dict.fromkeys(self.converted[name].keys))
        return list(keys)

    def assemble(self, names: Iterable[str], tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The model tensors ``names`` made of the checkpoint's ``tensors`` (read by :meth:`keys_for`)."""
        wanted = list(names)
        made: dict[str, Tensor] = {}
        for name in wanted:
            if name in self.plain:
                made[name] = tensors[self.plain[name]]
            elif name in self.converted and name not in made:
                made.update(self.converted[name].run(tensors, self.model))
        return {name: made[name] for name in wanted if name in made}

    def stored(self, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """``tensors`` (model name to tensor) as the checkpoint stores them, by key (:meth:`key_of`), converted back
        where needed."""
        stored: dict[str, Tensor] = {}
        groups: dict[int, tuple[Converted, dict[str, Tensor]]] = {}
        for name, tensor in tensors.items():
            if name in self.converted:
                made = self.converted[name]
                groups.setdefault(id(made), (made, {}))[1][name] = tensor
            else:
                stored[self.key_of(name)] = tensor
        for made, parts in groups.values():
            stored.update(self._back(made, parts))
        return stored

    def _back(self, made: Converted, parts: dict[str, Tensor]) -> dict[str, Tensor]:
        from transformers.core_model_loading import revert_weight_conversion

        missing = [name for name in made.targets if name not in parts]
        if missing:
            raise ValueError(f"cannot store {missing[0]} apart from the tensors it is converted with")
        back = revert_weight_conversion(self.model, parts)
        if not set(back) <= set(made.keys):  # fewer where experts were removed
            raise ValueError(
                f"transformers stores {', '.join(made.targets)} as {', '.join(sorted(back))}, not as the checkpoint "
                f"did ({', '.join(made.keys)})"
            )
        return back

    def _convert(self, keys: list[str], entries: Mapping[str, TensorEntry], state: Mapping[str, Tensor]) -> None:
        """Plan the conversions of ``keys`` (those no model name holds) with transformers' tables, on meta tensors."""
        try:
            from transformers import PreTrainedModel
            from transformers.conversion_mapping import get_model_conversion_mapping
            from transformers.core_model_loading import (
                WeightConverter,
                WeightRenaming,
                dot_natural_key,
                rename_source_key,
            )
        except ImportError:  # no transformers, or one before its conversion tables (4.x): names as they are
            return
        if not isinstance(self.model, PreTrainedModel):
            return
        conversions = get_model_conversion_mapping(self.model)
        renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
        converters = [c for c in conversions if isinstance(c, WeightConverter)]
        by_pattern = {pattern: c for c in converters for pattern in c.source_patterns}
        prefix = getattr(self.model, "base_model_prefix", None)
        grouped: dict[str, list[tuple[str, str]]] = {}
        known = dict(state)
        for key in sorted(keys, key=dot_natural_key):  # experts 0, 1, ..., 10 in order, as transformers stacks them
            target, pattern = rename_source_key(key, renamings, converters, prefix, known)
            if pattern is None:
                if target in state and target not in self.plain:
                    self.plain[target] = key
            else:
                grouped.setdefault(target, []).append((key, pattern))
        meta = {key: _meta(entry) for key, entry in entries.items()}
        for target, found in grouped.items():
            plan = Converted((target,), tuple(k for k, _ in found), tuple(p for _, p in found), by_pattern[found[0][1]])
            try:
                made = plan.run(meta, self.model)
            except Exception:  # a conversion that cannot run on meta tensors is not planned: its keys stay unknown
                continue
            if made and all(name in state and made[name].shape == state[name].shape for name in made):
                plan = Converted(tuple(made), plan.keys, plan.patterns, plan.converter)
                self.converted.update(dict.fromkeys(made, plan))


def _meta(entry: TensorEntry) -> Tensor:
    """A meta tensor of the entry's shape and dtype (float32 for a dtype torch has no name for here)."""
    return torch.empty(entry.shape, dtype=_DTYPES.get(entry.dtype, torch.float32), device="meta")


_DTYPES = {code: getattr(torch, name) for name, code in DTYPE_CODES.items()}
