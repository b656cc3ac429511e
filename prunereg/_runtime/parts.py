"""The parts of a decoder block found by their Hugging Face names: MLP channels, attention heads, experts.

A *unit group* is a set of equal units inside one block (the channels of an MLP,
the key/value groups of an attention) together with every tensor entry that
belongs to each unit: :class:`Cut` lists, per tensor, where each unit's entries lie
along one dim (fused projections such as Phi-3's ``qkv_proj`` hold several
segments). The *writer* is the projection that writes the part's output into the
residual stream, whose input channels shrink methods score and recovery refits.
Experts are found as a router (``gate``) beside an ``experts`` module holding one
slice per expert along the first dim of each of its tensors.

Nothing here slices a tensor: ``prunereg._shrink.removal`` cuts through the
slimming surgery. :func:`add_zero_biases` gives a part's Linears the zero biases
a config flag (``mlp_bias``, ``attention_bias``) would build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._runtime.blocks import is_conv1d, weight_matrix
from prunereg._runtime.journal import Journal


@dataclass(frozen=True)
class Cut:
    """Where each unit's entries lie in ``module.<tensor>`` along ``dim``: ``(offset, width)`` per segment.

    Unit ``u`` owns entries ``offset + u * width + [0, width)`` of every segment;
    the segments cover the whole dim.
    """

    module: nn.Module
    tensor: str
    dim: int
    segments: tuple[tuple[int, int], ...]

    def kept_entries(self, kept_units: Tensor) -> Tensor:
        parts = []
        for offset, width in self.segments:
            entries = kept_units[:, None] * width + torch.arange(width)
            parts.append(offset + entries.reshape(-1))
        return torch.cat(parts)


@dataclass
class UnitGroup:
    """The units of one kind in one block: ``n_units`` of them, each ``channels_per_unit`` writer inputs."""

    kind: str  # "mlp" or "heads"
    owner: nn.Module  # the MLP or attention module
    n_units: int
    writer: nn.Module
    channels_per_unit: int
    cuts: list[Cut] = field(default_factory=list)
    bias_flag: str | None = None  # the config flag that gives the writer a bias, if it has none now
    query_heads_per_unit: int = 1

    def cut_new_biases(self) -> None:
        """Add the cuts of biases created after the group was found (:func:`add_zero_biases`)."""
        with_bias = {id(cut.module) for cut in self.cuts if cut.tensor == "bias"}
        for cut in list(self.cuts):
            linear = cut.module
            is_output_cut = cut.tensor == "weight" and cut.dim == 0 and isinstance(linear, nn.Linear)
            if is_output_cut and id(linear) not in with_bias and getattr(linear, "bias", None) is not None:
                self.cuts.append(Cut(linear, "bias", 0, cut.segments))

    def writer_weight(self) -> Tensor:
        """The writer's weight as ``[out, in]``: its input channels are the columns."""
        return weight_matrix(self.writer)

    def changed(self, *, with_biases: bool) -> tuple[list[nn.Module], list[Tensor]]:
        """The modules and tensors removing units changes (``with_biases``: and the Linears a compensation biases)."""
        modules = [self.owner, self.writer, *(cut.module for cut in self.cuts)]
        if with_biases:
            modules += [module for module in self.owner.children() if isinstance(module, nn.Linear)]
        tensors = [getattr(cut.module, cut.tensor) for cut in self.cuts]
        return modules, [tensor for tensor in tensors if isinstance(tensor, Tensor)]


@dataclass
class Experts:
    """A mixture-of-experts layer: its router and the module holding the experts' tensors."""

    owner: nn.Module
    router: nn.Module
    experts: nn.Module
    n_experts: int

    def sliced(self) -> list[tuple[nn.Module, str, Tensor]]:
        """The tensors holding one slice per expert along their first dim (the experts' and the router's)."""
        found = []
        for module in (self.experts, self.router):
            named = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
            found += [(module, name, t) for name, t in named if t.dim() >= 1 and t.shape[0] == self.n_experts]
        return found


def _linear_cuts(layer: nn.Module, side: str, segments: tuple[tuple[int, int], ...]) -> list[Cut]:
    """The cuts of a Linear (or Conv1D) along its outputs (``side="out"``) or inputs, bias included for outputs."""
    conv = is_conv1d(layer)
    if side == "out":
        cuts = [Cut(layer, "weight", 1 if conv else 0, segments)]
        if getattr(layer, "bias", None) is not None:
            cuts.append(Cut(layer, "bias", 0, segments))
        return cuts
    return [Cut(layer, "weight", 0 if conv else 1, segments)]


def _child(module: nn.Module, *names: str) -> nn.Module | None:
    for name in names:
        child = getattr(module, name, None)
        if isinstance(child, nn.Module):
            return child
    return None


def _sub(module: nn.Module, name: str) -> nn.Module:
    child = getattr(module, name)
    assert isinstance(child, nn.Module)
    return child


def _has(module: nn.Module, *names: str) -> bool:
    return all(isinstance(getattr(module, name, None), nn.Module) for name in names)


def find_mlp(block: nn.Module, config: Any) -> UnitGroup | str:
    """The block's MLP channels as a unit group, or why they cannot be removed."""
    mlp = _child(block, "mlp")
    if mlp is None and _has(block, "fc1", "fc2"):  # OPT: the MLP's two layers sit in the block itself
        shapes = _misshapen(block, "fc1", "fc2")
        if shapes:
            return shapes
        fc2 = _sub(block, "fc2")
        cuts = _linear_cuts(_sub(block, "fc1"), "out", ((0, 1),)) + _linear_cuts(fc2, "in", ((0, 1),))
        flag = None if getattr(fc2, "bias", None) is not None else "mlp_bias"  # enable_bias would add more
        return _checked(UnitGroup("mlp", block, weight_matrix(fc2).shape[1], fc2, 1, cuts, bias_flag=flag))
    if mlp is None:
        return f"{type(block).__name__} has no 'mlp' module prunereg knows"
    if find_experts(block) is not None:
        return f"{type(block).__name__}'s MLP is a mixture of experts; shrink experts=... instead"
    shapes = _misshapen(mlp, "gate_proj", "up_proj", "gate_up_proj", "down_proj", "c_fc", "c_proj")
    if shapes:
        return shapes
    if _has(mlp, "gate_proj", "up_proj", "down_proj"):
        down = _sub(mlp, "down_proj")
        size = weight_matrix(down).shape[1]
        cuts = _linear_cuts(_sub(mlp, "gate_proj"), "out", ((0, 1),)) + _linear_cuts(
            _sub(mlp, "up_proj"), "out", ((0, 1),)
        )
    elif _has(mlp, "gate_up_proj", "down_proj"):  # Phi-3: gate and up stacked in one projection
        down = _sub(mlp, "down_proj")
        size = weight_matrix(down).shape[1]
        cuts = _linear_cuts(_sub(mlp, "gate_up_proj"), "out", ((0, 1), (size, 1)))
    elif _has(mlp, "c_fc", "c_proj"):  # GPT-2
        down = _sub(mlp, "c_proj")
        size = weight_matrix(down).shape[1]
        cuts = _linear_cuts(_sub(mlp, "c_fc"), "out", ((0, 1),))
    else:
        return f"{type(mlp).__name__} is no gate/up/down or fc/proj MLP prunereg knows"
    cuts += _linear_cuts(down, "in", ((0, 1),))
    flag = None if getattr(down, "bias", None) is not None else "mlp_bias"
    return _checked(UnitGroup("mlp", mlp, size, down, 1, cuts, bias_flag=flag))


def find_heads(block: nn.Module, config: Any) -> UnitGroup | str:
    """The block's attention key/value groups (each with its query heads) as a unit group, or why not."""
    attention = _child(block, "self_attn", "attn", "attention")
    if attention is None:
        return f"{type(block).__name__} has no attention module prunereg knows"
    if _has(attention, "c_attn") or _has(attention, "out_proj"):  # GPT-2, OPT
        return (
            f"{type(attention).__name__} derives head_dim from the hidden size and the head count, "
            "so no config can state fewer heads"
        )
    n_heads = _config_int(config, "num_attention_heads")
    n_kv = _config_int(config, "num_key_value_heads") or n_heads
    if not n_heads or not n_kv or n_heads % n_kv:
        return "the config does not state num_attention_heads (and num_key_value_heads) prunereg can use"
    shapes = _misshapen(attention, "q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj")
    if shapes:
        return shapes
    head_dim = getattr(attention, "head_dim", None)
    if not isinstance(head_dim, int):
        return f"{type(attention).__name__} has no head_dim attribute"
    ratio = n_heads // n_kv
    q_width, kv_width = ratio * head_dim, head_dim
    if _has(attention, "q_proj", "k_proj", "v_proj", "o_proj"):
        cuts = _linear_cuts(_sub(attention, "q_proj"), "out", ((0, q_width),))
        cuts += _linear_cuts(_sub(attention, "k_proj"), "out", ((0, kv_width),))
        cuts += _linear_cuts(_sub(attention, "v_proj"), "out", ((0, kv_width),))
    elif _has(attention, "qkv_proj", "o_proj"):  # Phi-3: q, k and v stacked
        q_size, kv_size = n_heads * head_dim, n_kv * head_dim
        segments = ((0, q_width), (q_size, kv_width), (q_size + kv_size, kv_width))
        cuts = _linear_cuts(_sub(attention, "qkv_proj"), "out", segments)
    else:
        return f"{type(attention).__name__} has no q/k/v/o projections prunereg knows"
    writer = _sub(attention, "o_proj")
    if weight_matrix(writer).shape[1] != n_heads * head_dim:
        return f"{type(attention).__name__}.o_proj does not read num_attention_heads * head_dim inputs"
    cuts += _linear_cuts(writer, "in", ((0, q_width),))
    flag = None if getattr(writer, "bias", None) is not None else "attention_bias"
    return _checked(
        UnitGroup("heads", attention, n_kv, writer, q_width, cuts, bias_flag=flag, query_heads_per_unit=ratio)
    )


def find_experts(block: nn.Module) -> Experts | None:
    """The block's mixture-of-experts layer (a router ``gate`` beside an ``experts`` module), if any."""
    for module in block.modules():
        router, experts = getattr(module, "gate", None), getattr(module, "experts", None)
        if not (isinstance(router, nn.Module) and isinstance(experts, nn.Module)):
            continue
        weight = getattr(router, "weight", None)
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            continue
        n = weight.shape[0]
        stacked = [p for p in experts.parameters(recurse=False) if p.dim() >= 2 and p.shape[0] == n]
        if stacked:
            return Experts(module, router, experts, n)
    return None


def _misshapen(owner: nn.Module, *names: str) -> str | None:
    """Why one of ``owner``'s projections named ``names`` (those it has) cannot be cut as a Linear, or None."""
    for name in names:
        layer = getattr(owner, name, None)
        if not isinstance(layer, nn.Module):
            continue
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            held = f"a {weight.dim()}-D weight" if isinstance(weight, Tensor) else "no weight tensor"
            return f"{type(owner).__name__}.{name} ({type(layer).__name__}) has {held}, not a Linear's 2-D one"
    return None


def _checked(group: UnitGroup) -> UnitGroup | str:
    """``group``, or why its cuts do not fit its tensors (each cut must cover its tensor's dim exactly)."""
    owner = type(group.owner).__name__
    names = {id(module): f"{owner}.{name}" for name, module in group.owner.named_modules()}
    for cut in group.cuts:
        tensor = getattr(cut.module, cut.tensor)
        expected = sum(group.n_units * width for _, width in cut.segments)
        if tensor.shape[cut.dim] != expected:
            units = "channels" if group.kind == "mlp" else "key/value groups"
            return (
                f"{names[id(cut.module)]}.{cut.tensor} has {tensor.shape[cut.dim]} entries along dim {cut.dim}, "
                f"not the {expected} of {group.n_units} {units} ({names[id(group.writer)]} reads "
                f"{group.writer_weight().shape[1]} inputs): the projections disagree on the width"
            )
    return group


def _config_int(config: Any, name: str) -> int | None:
    value = getattr(config, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def add_zero_biases(owner: nn.Module, journal: Journal) -> None:
    """Give every Linear directly inside ``owner`` a zero bias if it has none (what ``mlp_bias=True`` would build)."""
    for module in owner.children():
        if isinstance(module, nn.Linear) and module.bias is None:
            journal.keep(module)
            weight = module.weight
            module.bias = nn.Parameter(torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device))
