"""Cutting a planned model, and putting it back exactly as it was.

:func:`cut` keeps the planned positions of every tensor (through
:mod:`.surgery`) and sets what follows from them: tied tensors, pruning
hooks, groups, size attributes, head counts. :class:`Snapshot` holds every
module's own attributes and tensor objects from before, so that a refusal,
or a plan tried again another way, starts from the model as it was.
"""

from __future__ import annotations

import copy
from types import TracebackType

from torch import Tensor, nn

from prunereg._core.reparam import PruningHook, set_pruned_tensor
from prunereg._slim.graph import DependencyGraph
from prunereg._slim.groups import TensorDim
from prunereg._slim.report import TensorChange
from prunereg._slim.surgery import keep_indices, sync_shape_attributes
from prunereg._slim.widths import sync_attention


def cut(
    model: nn.Module, graph: DependencyGraph, keep: dict[TensorDim, Tensor]
) -> tuple[list[TensorChange], list[str]]:
    """Keep the positions ``keep`` of every tensor dimension that loses some; the changes, and the modules touched.

    A tied tensor is cut once for all its holders; a pruning hook's tensor, a
    convolution's or GroupNorm's groups, the layers' size attributes and the
    attention modules' head counts follow the cut tensors.
    """
    by_tensor: dict[str, list[tuple[int, Tensor]]] = {}
    for (name, dim), positions in keep.items():
        by_tensor.setdefault(name, []).append((dim, positions))
    aliases = _aliases(model)
    names = {id(module): name for name, module in model.named_modules(remove_duplicate=False)}
    touched: dict[str, nn.Module] = {}
    changes: list[TensorChange] = []
    order = {name: k for k, name in enumerate(graph.tensors)}
    for name in sorted(by_tensor, key=order.__getitem__):
        owner, _, attribute = name.rpartition(".")
        module = model.get_submodule(owner)
        old = getattr(module, attribute)
        before = tuple(old.shape)
        for dim, positions in sorted(by_tensor[name], key=lambda item: item[0]):
            keep_indices(module, attribute, dim, positions)
        new = getattr(module, attribute)
        for other_module, other_attribute in aliases.get(id(old), []):
            holder = other_module._parameters if other_attribute in other_module._parameters else other_module._buffers
            holder[other_attribute] = new
            touched[names[id(other_module)]] = other_module
        touched[owner] = module
        if not name.endswith("_mask"):
            changes.append(TensorChange(name.removesuffix("_orig"), before, tuple(new.shape)))
    # by module, not name: a module shared by several blocks goes by any of its names
    conv_groups, norm_groups = (_by_module(model, per_name) for per_name in (graph.conv_groups, graph.norm_groups))
    for module in touched.values():
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, PruningHook):
                set_pruned_tensor(hook, module)
        if id(module) in conv_groups and isinstance(module, nn.modules.conv._ConvNd):
            module.groups = module.weight.shape[0] // conv_groups[id(module)]
        sync_shape_attributes(module)
        if id(module) in norm_groups and isinstance(module, nn.GroupNorm):
            module.num_groups = module.num_channels // norm_groups[id(module)]
    for owner in {name.rpartition(".")[0] for name in touched}:
        parent = model.get_submodule(owner) if owner else model
        sync_attention(parent)
    for name, module in model.named_modules():
        if isinstance(module, nn.MultiheadAttention) and any(t.startswith(name + ".") or t == name for t in touched):
            sync_attention(module)
    return changes, list(touched)


def _aliases(model: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    """Every (module, name) holding each parameter or buffer, so that a tied tensor is cut once for all holders."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, tensor in [*module._parameters.items(), *module._buffers.items()]:
            if tensor is not None:
                holders.setdefault(id(tensor), []).append((module, name))
    return holders


class Snapshot:
    """Every module's attributes (parameters and buffers as the same objects) and a Hugging Face config, as they were.

    Used as a context manager, the model is put back if the block raises;
    :meth:`restore` puts it back at any time, as often as needed.
    """

    def __init__(self, model: nn.Module) -> None:
        self._saved = []
        for module in model.modules():
            state = dict(module.__dict__)
            state["_parameters"] = dict(module._parameters)
            state["_buffers"] = dict(module._buffers)
            self._saved.append((module, state))
        self._config = getattr(model, "config", None)
        has_state = self._config is not None and hasattr(self._config, "__dict__")
        self._config_state = copy.copy(self._config.__dict__) if has_state else None

    def restore(self) -> None:
        for module, state in self._saved:
            module.__dict__.clear()
            module.__dict__.update(state)
            module.__dict__["_parameters"] = dict(state["_parameters"])  # the saved ones stay as they were
            module.__dict__["_buffers"] = dict(state["_buffers"])
        if self._config_state is not None:
            self._config.__dict__.clear()
            self._config.__dict__.update(self._config_state)

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if error is not None:
            self.restore()


def _by_module(model: nn.Module, per_name: dict[str, int]) -> dict[int, int]:
    return {id(model.get_submodule(name)): value for name, value in per_name.items()}
