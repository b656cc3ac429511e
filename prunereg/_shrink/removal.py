"""Removing the units of a decoder block's parts, its experts or whole blocks, each change kept in a journal.

Every tensor is cut by :mod:`prunereg._slim.surgery` (``keep_indices``), and the
size attributes the modules hold (head counts, ``intermediate_size``, expert
counts) are set to match. What each removal replaced goes to a
:class:`~prunereg._runtime.journal.Journal`, so a failed shrink puts it back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from prunereg._runtime.journal import Journal
from prunereg._runtime.parts import Experts, UnitGroup
from prunereg._slim.surgery import keep_indices, sync_shape_attributes

#: The module attributes that count heads, rewritten when key/value groups go.
HEAD_COUNTS = ("num_heads", "num_attention_heads", "n_head")
KV_HEAD_COUNTS = ("num_key_value_heads", "num_kv_heads")
EXPERT_COUNTS = ("num_experts", "num_local_experts")


def remove_units(group: UnitGroup, kept: Tensor, journal: Journal) -> None:
    """Keep only the units ``kept`` (sorted indices) of ``group``, through the surgery, and fix size attributes."""
    for cut in group.cuts:
        journal.keep(cut.module)
        keep_indices(cut.module, cut.tensor, cut.dim, cut.kept_entries(kept))
    for module in {id(cut.module): cut.module for cut in group.cuts}.values():
        sync_shape_attributes(module)
    journal.keep(group.owner)
    n_kept = int(kept.numel())
    if group.kind == "mlp":
        _set_ints(group.owner, ("intermediate_size", "intermediate_dim"), n_kept)
    else:
        _set_ints(group.owner, KV_HEAD_COUNTS, n_kept)
        _set_ints(group.owner, HEAD_COUNTS, n_kept * group.query_heads_per_unit)


def compensate_bias(group: UnitGroup, removed_channels: Tensor, mean: Tensor, journal: Journal) -> None:
    """Add the mean contribution of the removed writer inputs to the writer's bias (FLAP's compensation).

    The writer must already have a bias (:func:`add_zero_biases`); the sum runs in
    float32 and the new bias, a new tensor, is stored in the writer's dtype.
    """
    writer = group.writer
    bias = writer.bias
    assert isinstance(bias, Tensor)
    journal.keep(writer)
    weight = group.writer_weight().detach().float()
    index = removed_channels.to(weight.device)
    contribution = weight[:, index] @ mean.to(weight.device, torch.float32)[index]
    new_bias = (bias.detach().float() + contribution).to(bias.dtype)
    writer.bias = nn.Parameter(new_bias, requires_grad=bias.requires_grad)


def remove_experts(layer: Experts, kept: Tensor, journal: Journal) -> None:
    """Keep only the experts ``kept`` of ``layer``: their slices of every expert tensor and their router rows."""
    for module in (layer.experts, layer.router, layer.owner):
        journal.keep(module)
    for module, name, _ in layer.sliced():
        keep_indices(module, name, 0, kept)
    for module in (layer.owner, layer.router, layer.experts):
        _set_ints(module, EXPERT_COUNTS, int(kept.numel()))
    layer.n_experts = int(kept.numel())


def remove_blocks(blocks: nn.ModuleList, removed: Sequence[int], journal: Journal) -> None:
    """Take the blocks at ``removed`` out of ``blocks`` and renumber the ``layer_idx`` of those left."""
    if journal.enabled:
        journal.lists.append((blocks, list(blocks)))
    for index in sorted(removed, reverse=True):
        del blocks[index]
    for new_index, block in enumerate(blocks):
        for module in block.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                journal.keep(module)
                setattr(module, "layer_idx", new_index)  # noqa: B010 - any module's attribute


def _set_ints(module: nn.Module, names: Sequence[str], value: int) -> None:
    for name in names:
        if isinstance(vars(module).get(name), int):
            setattr(module, name, value)
