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
first, so every forward uses ``orig * mask`` as it is now. Pruned where it
lives, the way any loop over ``nn.Linear`` modules does
(``prune.l1_unstructured(layer.self_attn.out_proj, "weight", 0.5)``), the
readers above are found too (:func:`readers_above`), and get the same hook.
"""

from __future__ import annotations

import gc
from typing import Any

from torch import nn

from prunereg._core import reparam

READERS: tuple[type[nn.Module], ...] = (nn.MultiheadAttention, nn.TransformerEncoderLayer)
"""Module classes whose forward reads their submodules' tensors directly."""

READ_BY_THEIR_HOLDER: tuple[type[nn.Module], ...] = (
    nn.modules.linear.NonDynamicallyQuantizableLinear,  # out_proj, which only nn.MultiheadAttention holds
    nn.MultiheadAttention,  # read by the encoder and decoder layers' fast path
)
"""Module classes whose tensors a reader holding them reads directly: only these are looked up from below."""


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
    """Give every reader of the tensor ``qualified`` (named from ``root``) a refresh hook (once).

    The readers are those on the way from ``root`` to the tensor and, when
    ``root`` is itself read by a module holding it (``out_proj``), those above ``root``.
    """
    for reader, relative in _readers(root, qualified):
        path, _, name = relative.rpartition(".")
        refresh = RefreshPruned(path, name)
        if refresh not in reader._forward_pre_hooks.values():
            reader.register_forward_pre_hook(refresh)


def forget_refreshes(root: nn.Module, qualified: str) -> None:
    """Drop the refresh hooks :func:`refresh_where_read` gave for ``qualified``."""
    for reader, relative in _readers(root, qualified):
        path, _, name = relative.rpartition(".")
        for key, hook in list(reader._forward_pre_hooks.items()):
            if hook == RefreshPruned(path, name):
                del reader._forward_pre_hooks[key]


def _readers(root: nn.Module, qualified: str) -> list[tuple[nn.Module, str]]:
    if "." not in qualified and not isinstance(root, READ_BY_THEIR_HOLDER):
        return []  # a tensor of root itself, which no reader reads directly: the loop over a model's layers
    above = [(reader, f"{path}.{qualified}") for reader, path in readers_above(root)]
    return above + _readers_on_path(root, qualified)


def readers_above(module: nn.Module) -> list[tuple[nn.Module, str]]:
    """The readers holding ``module``, directly or through readers above them, with its path from each.

    Modules know nothing of their parents, so the holders are found through the
    garbage collector (a scan of the objects it tracks); only for the classes
    readers read directly (:data:`READ_BY_THEIR_HOLDER`), so pruning anything
    else never pays for it.
    """
    found: list[tuple[nn.Module, str]] = []
    pending = [(module, "")]
    while pending:
        child, path = pending.pop()
        if not isinstance(child, READ_BY_THEIR_HOLDER):
            continue
        slots = [
            held for held in gc.get_referrers(child) if type(held) is dict and any(v is child for v in held.values())
        ]
        for holder, key in modules_holding(slots, child, "_modules"):
            if isinstance(holder, READERS):
                relative = f"{key}.{path}" if path else key
                found.append((holder, relative))
                pending.append((holder, relative))
    return found


def modules_holding(dicts: list[dict[Any, Any]], value: object, slot: str) -> list[tuple[nn.Module, str]]:
    """Each ``(module, key)`` whose ``slot`` dict (``_parameters``, ``_modules``) is in ``dicts`` and holds ``value``.

    ``dicts`` come from ``gc.get_referrers(value)``; a module holds its slot
    dicts directly or, once its ``__dict__`` exists as an object, through that dict.
    """
    holders: list[tuple[nn.Module, str]] = []
    pending: list[Any] = dicts
    while pending:
        module_dicts = []
        for referrer in gc.get_referrers(*pending):
            if isinstance(referrer, nn.Module) and any(referrer.__dict__.get(slot) is held for held in dicts):
                holders += [(referrer, key) for key, held in referrer.__dict__[slot].items() if held is value]
            elif type(referrer) is dict and pending is dicts and any(referrer.get(slot) is held for held in dicts):
                module_dicts.append(referrer)
        pending = module_dicts
    return list(dict.fromkeys(holders))


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
