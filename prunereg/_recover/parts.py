"""The parts of a decoder block recovery works on, as shrinking finds them: writer projections and the MLP.

A *writer* is the projection that writes an attention's or an MLP's output into
the residual stream (``o_proj``, ``down_proj``): the one a refit solves for.
The MLP module is the MLP (or the mixture of experts) whose output the block
adds to its residual stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from prunereg._recover.runtime import UnitGroup, find_experts, find_heads, find_mlp

#: The unit-group finder of each writer kind.
FINDERS = {"mlp": find_mlp, "attention": find_heads}


@dataclass
class BlockParts:
    """A block's writer projections by kind (``"mlp"``, ``"attention"``), and its MLP module if it has one."""

    writers: dict[str, nn.Module]
    mlp: nn.Module | None
    owners: dict[str, nn.Module]
    """The attention and MLP modules by kind, where found."""


def block_parts(block: nn.Module, config: Any) -> BlockParts:
    """The block's writers (those the config lets shrinking find) and its MLP module (a mixture of experts too)."""
    writers: dict[str, nn.Module] = {}
    owners: dict[str, nn.Module] = {}
    for kind, finder in FINDERS.items():
        found = finder(block, config) if config is not None or kind == "mlp" else None
        if isinstance(found, UnitGroup):
            writers[kind] = found.writer
            if found.owner is not block:
                owners[kind] = found.owner
    if "mlp" not in owners:
        experts = find_experts(block)
        if experts is not None and experts.owner is not block:
            owners["mlp"] = experts.owner
    return BlockParts(writers, owners.get("mlp"), owners)


def changed_parts(parts: BlockParts, block: nn.Module, teacher: nn.Module) -> frozenset[str]:
    """The kinds (``"attention"``, ``"mlp"``) whose module holds a tensor the teacher block's lacks or holds otherwise.

    Narrowed, pruned, bias-compensated or recovered before: the part is no longer the dense model's.
    """
    names = {id(module): name for name, module in block.named_modules()}
    changed = set()
    for kind, owner in parts.owners.items():
        theirs = dict(teacher.get_submodule(names[id(owner)]).named_parameters())
        for name, parameter in owner.named_parameters():
            other = theirs.get(name)
            if other is None and not bool(parameter.detach().any()):
                continue  # a zero bias, as a config flag builds it, changes nothing
            if other is None or other.shape != parameter.shape or not torch.equal(other, parameter):
                changed.add(kind)
                break
    return frozenset(changed)


def bias_flags(config: Any, blocks: nn.ModuleList, kinds: frozenset[str]) -> dict[str, list[nn.Module]]:
    """Per config flag to switch on for the writer biases of ``kinds``, the modules that get zero biases.

    A flag is switched on only if every block's writer of that kind lacks a
    bias and the config has the flag (what stock ``from_pretrained`` builds).
    """
    flags: dict[str, list[nn.Module]] = {}
    if config is None:
        return flags
    for kind in sorted(kinds):
        groups = [FINDERS[kind](block, config) for block in blocks]
        units = [group for group in groups if isinstance(group, UnitGroup)]
        if len(units) != len(groups):
            continue
        flag = units[0].bias_flag
        if flag and hasattr(config, flag) and all(g.bias_flag == flag and g.writer.bias is None for g in units):
            flags[flag] = [group.owner for group in units]
    return flags
