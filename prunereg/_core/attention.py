"""Pruned tensors that an ancestor module reads directly, without running their module's forward.

``nn.MultiheadAttention`` hands ``out_proj.weight`` straight to
``F.multi_head_attention_forward``; ``out_proj``'s forward, and so its pruning
hook, never runs. With torch the tensor is computed once, so the second
backward goes through a freed graph (pytorch#69353) and later forwards use
stale values. ``nn.TransformerEncoderLayer``'s fast path (eval, no grad) reads
every weight of its attention and feed-forward the same way.

When a tensor is pruned through such a reader (``prune.l1_unstructured(attention,
"out_proj.weight", 0.5)``, or from any module above it), the reader gets a
:class:`RefreshPruned` forward pre-hook that runs the tensor's pruning hook
first, so every forward uses ``orig * mask`` as it is now.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

from prunereg._core import reparam

READERS: tuple[type[nn.Module], ...] = (nn.MultiheadAttention, nn.TransformerEncoderLayer)
"""Module classes whose forward reads their submodules' tensors directly."""


class RefreshPruned:
    """Forward pre-hook of a reader: recompute the pruned tensor ``<path>.<name>`` before the reader uses it."""

    def __init__(self, path: str, name: str) -> None:
        self.path = path
        self.name = name

    def __call__(self, module: nn.Module, inputs: Any) -> None:
        owner = module.get_submodule(self.path)
        for _, hook in reparam.pruning_hooks(owner, self.name):
            hook(owner, inputs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RefreshPruned) and (self.path, self.name) == (other.path, other.name)

    def __hash__(self) -> int:
        return hash((self.path, self.name))

    def __repr__(self) -> str:
        return f"RefreshPruned({self.path!r}, {self.name!r})"


def refresh_where_read(root: nn.Module, qualified: str) -> None:
    """Give every reader on the way from ``root`` to the tensor ``qualified`` a refresh hook (once)."""
    for reader, relative in _readers_on_path(root, qualified):
        path, _, name = relative.rpartition(".")
        refresh = RefreshPruned(path, name)
        if refresh not in reader._forward_pre_hooks.values():
            reader.register_forward_pre_hook(refresh)


def forget_refreshes(root: nn.Module, qualified: str) -> None:
    """Drop the refresh hooks :func:`refresh_where_read` gave for ``qualified``."""
    for reader, relative in _readers_on_path(root, qualified):
        path, _, name = relative.rpartition(".")
        for key, hook in list(reader._forward_pre_hooks.items()):
            if hook == RefreshPruned(path, name):
                del reader._forward_pre_hooks[key]


def _readers_on_path(root: nn.Module, qualified: str) -> list[tuple[nn.Module, str]]:
    """The readers above the tensor ``qualified`` (its own module excluded), with its name relative to each."""
    parts = qualified.split(".")
    found = []
    module = root
    for depth in range(len(parts) - 1):
        if isinstance(module, READERS):
            found.append((module, ".".join(parts[depth:])))
        module = module.get_submodule(parts[depth])
    return found


def warn_if_read_elsewhere(root: nn.Module, module: nn.Module, name: str) -> None:
    """Warn when ``out_proj`` of an attention module is pruned on its own: the attention bypasses its hook.

    ``module.<name>`` is the tensor pruned, named from ``root``.
    """
    if module is root and isinstance(module, nn.modules.linear.NonDynamicallyQuantizableLinear):
        warnings.warn(
            f"pruning {name!r} of nn.MultiheadAttention's out_proj on its own: the attention reads it "
            "directly, so training would reuse a stale tensor; prune it from the attention module instead, "
            f"prune.l1_unstructured(attention, 'out_proj.{name}', ...)",
            UserWarning,
            stacklevel=4,
        )
