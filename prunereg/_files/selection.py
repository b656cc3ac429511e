"""Which tensors of a model file ``prunereg prune`` prunes, and why it leaves the others alone.

By default: every floating-point tensor of two or more dimensions, except
those whose names say they are embeddings, norms or an output head (a user
pruning a transformer keeps those whole). ``--include`` globs replace the
defaults: the floating-point tensors they match are pruned, whatever their
role or shape. ``--exclude`` globs leave out what they match.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from prunereg._files.dtypes import is_prunable
from prunereg._text import printable

NOT_FLOATING = "not floating point"
UNPRUNABLE_DTYPE = "of a dtype pruning cannot compute with"
FEW_DIMENSIONS = "fewer than 2 dimensions"
EMBEDDING = "embedding"
NORM = "norm"
OUTPUT_HEAD = "output head"
ROUTER = "router"
NOT_INCLUDED = "not matched by --include"
EXCLUDED = "matched by --exclude"

OUTPUT_HEADS = frozenset({"lm_head", "head", "pooler", "classifier", "cls", "score", "qa_outputs"})
"""Name parts of output heads (language-model, pooler and classification heads)."""
ROUTERS = frozenset({"router", "gate", "shared_expert_gate"})
"""Name parts of a mixture of experts' routers (``mlp.gate``, ``mlp.router``; never ``gate_proj``)."""


def role(name: str) -> str | None:
    """``EMBEDDING``, ``NORM``, ``OUTPUT_HEAD`` or ``ROUTER`` when a part of the dotted ``name`` says so, else None.

    The last part that says something decides (``embeddings.LayerNorm.weight``
    is a norm). Embeddings: a part containing ``embed``, or GPT-2's ``wte`` and
    ``wpe``. Norms: a part containing ``norm``, or ``ln``/``ln_*`` (GPT-2).
    Output heads: a part among :data:`OUTPUT_HEADS`. Routers: a part among
    :data:`ROUTERS` (a mixture's ``gate``, which chooses the experts: pruning it
    reroutes tokens, and it is a few thousandths of the weights).
    """
    for part in reversed(name.lower().split(".")):
        if "embed" in part or part in ("wte", "wpe"):
            return EMBEDDING
        if "norm" in part or part == "ln" or part.startswith("ln_"):
            return NORM
        if part in OUTPUT_HEADS:
            return OUTPUT_HEAD
        if part in ROUTERS:
            return ROUTER
    return None


def default_skip_reason(name: str, tensor: torch.Tensor) -> str | None:
    """Why the defaults leave ``name`` alone, or None when they prune it."""
    dtype_reason = _dtype_reason(tensor)
    if dtype_reason is not None:
        return dtype_reason
    found = role(name)
    if found is not None:
        return found
    if tensor.dim() < 2:
        return FEW_DIMENSIONS
    return None


def parameters_to_prune(model: nn.Module, ignore: Sequence[str] = ()) -> list[tuple[nn.Module, str]]:
    """The ``(module, name)`` pairs of ``model`` that ``prunereg prune`` would prune by default, in model order.

    The same rule as for a file (:func:`default_skip_reason`), applied to the
    model's parameters: weights of ``Linear``, convolutions and GPT-2's
    ``Conv1D``; embeddings, norms, biases and output heads left out, and so is
    every parameter sharing its tensor with one of those (a head tied to the
    embedding). ``ignore`` globs (shell-style, ``*`` also matches dots) leave
    out the parameters of the modules whose names they match. A pruned
    parameter is listed under its own name (``weight``, not ``weight_orig``).
    A tensor several prunable attributes share is one pair, named from
    ``model`` with a dotted name, so that pruning it prunes every use.
    Meant for ``prunereg.global_unstructured(prunereg.parameters_to_prune(model), ...)``.
    """
    holders: dict[int, list[tuple[str, nn.Module, str]]] = {}
    skipped: set[int] = set()
    for qualified, parameter in model.named_parameters(remove_duplicate=False):
        path, _, attribute = qualified.rpartition(".")
        module = model.get_submodule(path)
        if attribute.endswith("_orig") and attribute.removesuffix("_orig") + "_mask" in module._buffers:
            attribute = attribute.removesuffix("_orig")
            qualified = qualified.removesuffix("_orig")
        holders.setdefault(id(parameter), []).append((qualified, module, attribute))
        if default_skip_reason(qualified, parameter) is not None or _matches(path, ignore):
            skipped.add(id(parameter))
    pairs = []
    for key, places in holders.items():
        if key in skipped:
            continue
        qualified, module, attribute = places[0]
        pairs.append((module, attribute) if len(places) == 1 else (model, qualified))
    return pairs


@dataclass(frozen=True)
class Selection:
    """The names to prune, in file order, and every other name with the reason it is left alone."""

    selected: list[str]
    skipped: dict[str, str]

    @property
    def total(self) -> int:
        return len(self.selected) + len(self.skipped)

    def describe(self, *, limit: int = 8, width: int = 100) -> list[str]:
        """Indented lines naming what is selected, then what is skipped grouped by reason.

        Groups of more than ``limit`` names are shortened to glob patterns, with
        layer numbers as ``*`` (``encoder.layer.*.attention.self.query.weight (6)``).
        A group goes on one line if that fits in ``width`` characters, else one entry a line.
        """
        groups = [(f"selected {len(self.selected)}", self.selected)] if self.selected else []
        by_reason: dict[str, list[str]] = {}
        for name, reason in self.skipped.items():
            by_reason.setdefault(reason, []).append(name)
        groups += [(f"skipped {len(names)}, {reason}", names) for reason, names in by_reason.items()]
        lines = []
        for heading, names in groups:
            entries = [printable(entry) for entry in shorten(names, limit)]  # names from a file: no escapes
            inline = f"  {heading}: {', '.join(entries)}"
            lines += [inline] if len(inline) <= width else [f"  {heading}:"] + [f"    {entry}" for entry in entries]
        return lines

    def why_nothing(self) -> str:
        """One line saying why no tensor is selected, counting each reason."""
        counts: dict[str, int] = {}
        for reason in self.skipped.values():
            counts[reason] = counts.get(reason, 0) + 1
        if not counts:
            return "no tensor selected: the file holds no tensors"
        reasons = ", ".join(f"{count} {reason}" for reason, count in counts.items())
        return f"no tensor selected: of the {self.total} tensors, {reasons}"


def select(tensors: Mapping[str, torch.Tensor], include: Sequence[str] = (), exclude: Sequence[str] = ()) -> Selection:
    """Split ``tensors`` into those to prune and those left alone, keeping their order.

    Globs are shell-style (``*`` also matches dots) and case-sensitive.
    """
    selected: list[str] = []
    skipped: dict[str, str] = {}
    for name, tensor in tensors.items():
        reason = _reason(name, tensor, include, exclude)
        if reason is None:
            selected.append(name)
        else:
            skipped[name] = reason
    return Selection(selected, skipped)


def _reason(name: str, tensor: torch.Tensor, include: Sequence[str], exclude: Sequence[str]) -> str | None:
    if include and not _matches(name, include):
        return NOT_INCLUDED
    if _matches(name, exclude):
        return EXCLUDED
    if include:
        return _dtype_reason(tensor)
    return default_skip_reason(name, tensor)


def _dtype_reason(tensor: torch.Tensor) -> str | None:
    """Why ``tensor``'s dtype rules it out (integers; float8 and other narrow floats), or None."""
    if not tensor.is_floating_point():
        return NOT_FLOATING
    return None if is_prunable(tensor) else UNPRUNABLE_DTYPE


def _matches(name: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, glob) for glob in globs)


_NUMBER = re.compile(r"(?<![^.])\d+(?![^.])")  # a whole dotted part made of digits: a layer number


def shorten(names: Sequence[str], limit: int) -> list[str]:
    """``names``, or past ``limit`` names, patterns with counts: at most ``limit`` of them and a count of the rest."""
    if len(names) <= limit:
        return list(names)
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(_NUMBER.sub("*", name), []).append(name)
    shown = [members[0] if len(members) == 1 else f"{pattern} ({len(members)})" for pattern, members in groups.items()]
    if len(shown) <= limit + 1:  # "and 1 more" would take the place of the one it hides
        return shown
    return [*shown[:limit], f"and {len(shown) - limit} more"]
