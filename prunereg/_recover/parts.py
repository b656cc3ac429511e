"""The parts of a decoder block recovery works on, as shrinking finds them: writer projections and the MLP.

A *writer* is the projection that writes an attention's or an MLP's output into
the residual stream (``o_proj``, ``down_proj``): the one a refit solves for.
The MLP module is the MLP (or the mixture of experts) whose output the block
adds to its residual stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from prunereg._recover.runtime import UnitGroup, find_experts, find_heads, find_mlp

#: The unit-group finder of each writer kind.
FINDERS = {"mlp": find_mlp, "attention": find_heads}


@dataclass
class BlockParts:
    """A block's writer projections by kind (``"mlp"``, ``"attention"``), and its MLP module if it has one."""

    writers: dict[str, nn.Module]
    mlp: nn.Module | None


def block_parts(block: nn.Module, config: Any) -> BlockParts:
    """The block's writers (those the config lets shrinking find) and its MLP module (a mixture of experts too)."""
    writers: dict[str, nn.Module] = {}
    mlp: nn.Module | None = None
    for kind, finder in FINDERS.items():
        found = finder(block, config) if config is not None or kind == "mlp" else None
        if isinstance(found, UnitGroup):
            writers[kind] = found.writer
            if kind == "mlp" and found.owner is not block:
                mlp = found.owner
    if mlp is None:
        experts = find_experts(block)
        mlp = experts.owner if experts is not None and experts.owner is not block else None
    return BlockParts(writers, mlp)


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
