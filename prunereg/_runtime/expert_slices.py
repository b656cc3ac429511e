"""Each expert of a fused mixture as a layer of its own, so the engines that prune layers prune the experts too.

transformers 5 holds a mixture's experts as one tensor per projection,
``gate_up_proj`` ``[experts, 2 x width, hidden]`` and ``down_proj``, rather
than as Linear layers: an engine that looks for Linear layers sees none, and
the experts, most of the model's weights, stay dense. Here each expert's slice
of such a tensor is an :class:`ExpertSlice`, a Linear-like layer whose weight
is a view of that slice (``[out, in]``: transposed where the tensor is stored
``[experts, in, out]``), named ``<experts>.<tensor>.<expert>``
(``mlp.experts.gate_up_proj.3``).

While :class:`ExpertSlices` is entered, the mixture runs its own eager code
(transformers' loop over the experts the tokens chose, its
``experts_implementation="eager"``; or the module's own forward), and each
product of an expert's slice, ``F.linear(x, w[e])`` or ``x @ w[e]``, is handed
to that expert's layer: hooks on it see exactly the
tokens routed to that expert. What a method writes into a slice's weight lands
in the fused tensor; :meth:`ExpertSlices.fold_masks` then stacks the slices'
masks into one mask of the fused tensor, as ``torch.nn.utils.prune`` would
hold it.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

MASK = "weight_mask"


class ExpertSlice(nn.Module):
    """One expert's slice of a fused experts tensor, as a Linear layer whose weight is a view of it."""

    view: Tensor

    def __init__(self, fused: Tensor, expert: int, *, transposed: bool) -> None:
        super().__init__()
        view = fused.detach()[expert]
        self.weight = nn.Parameter(view.T if transposed else view, requires_grad=False)
        self.__dict__["view"] = self.weight  # not a second parameter: pruning would see the weight as tied
        """The slice itself, ``[out, in]``, also once a mask reparametrizes ``weight`` (to put values back into)."""
        self.expert, self.transposed = expert, transposed

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)


class _Mixture:
    """A fused mixture in a block: the module, its 3-D weight tensors by name, and whether they are ``[e, in, out]``."""

    def __init__(self, path: str, module: nn.Module, tensors: list[str], transposed: bool) -> None:
        self.path, self.module, self.tensors, self.transposed = path, module, tensors, transposed

    def names(self) -> Iterator[str]:
        for tensor in self.tensors:
            for expert in range(int(getattr(self.module, tensor).shape[0])):
                yield f"{self.path}.{tensor}.{expert}"


def _mixture(path: str, module: nn.Module) -> _Mixture | None:
    """``module`` as a fused mixture (an int ``num_experts`` and 3-D weights of that many experts), if it is one."""
    count = getattr(module, "num_experts", None)
    if isinstance(count, bool) or not isinstance(count, int) or not path:
        return None
    tensors = [
        name
        for name, parameter in module.named_parameters(recurse=False)
        if parameter.dim() == 3 and parameter.shape[0] == count and parameter.dtype.is_floating_point
    ]
    return _Mixture(path, module, tensors, bool(getattr(module, "is_transposed", False))) if tensors else None


def _mixtures(block: nn.Module) -> list[_Mixture]:
    """The block's fused mixtures."""
    return [found for path, module in block.named_modules() if (found := _mixture(path, module)) is not None]


def expert_slice_names(block: nn.Module) -> list[str]:
    """The names of every expert slice of the block's fused mixtures (``mlp.experts.gate_up_proj.3``)."""
    return [name for mixture in _mixtures(block) for name in mixture.names()]


def slice_tensor(block: nn.Module, name: str) -> tuple[_Mixture, str, int] | None:
    """For an expert slice's name: its mixture, the fused tensor's name and the expert; else ``None``."""
    path, _, expert = name.rpartition(".")
    owner, _, tensor = path.rpartition(".")
    if not expert.isdigit() or not owner:
        return None
    try:
        module = block.get_submodule(owner)
    except AttributeError:
        return None
    found = _mixture(owner, module)
    return (found, tensor, int(expert)) if found is not None and tensor in found.tensors else None


def slice_weight(block: nn.Module, name: str) -> Tensor | None:
    """An expert slice's weight in Linear's ``[out, in]`` layout (a view), or ``None`` for a name of no slice."""
    found = slice_tensor(block, name)
    if found is None:
        return None
    mixture, tensor, expert = found
    view = getattr(mixture.module, tensor)[expert]
    return view.T if mixture.transposed else view


class ExpertSlices:
    """The block's expert slices as layers (:attr:`layers`), routed to while entered; their masks folded after."""

    def __init__(self, block: nn.Module, wanted: Iterable[str] | None = None) -> None:
        self.mixtures = _mixtures(block)
        keep = None if wanted is None else set(wanted)
        self.layers: dict[str, ExpertSlice] = {}
        self._by_tensor: dict[int, tuple[Tensor, dict[int, ExpertSlice]]] = {}
        for mixture in self.mixtures:
            for tensor in mixture.tensors:
                fused = getattr(mixture.module, tensor)
                for expert in range(int(fused.shape[0])):
                    name = f"{mixture.path}.{tensor}.{expert}"
                    if keep is None or name in keep:
                        layer = ExpertSlice(fused, expert, transposed=mixture.transposed)
                        self.layers[name] = layer
                        self._by_tensor.setdefault(id(fused), (fused, {}))[1][expert] = layer

    def __enter__(self) -> ExpertSlices:
        self._held: list[tuple[nn.Module, Any]] = []
        for mixture in self.mixtures:
            module = mixture.module
            self._held.append((module, module.__dict__.get("forward")))  # a hook's own forward (accelerate's) stays
            module.forward = types.MethodType(_routed(module.forward, self._by_tensor), module)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for module, held in self._held:
            if held is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = held
        self._held = []

    def fold_masks(self, *, permanent: bool) -> None:
        """Put each fused tensor's slices' masks into one mask of the fused tensor (none where ``permanent``).

        The weights are in the fused tensors already (the slices are views);
        an expert no slice masked keeps every weight.
        """
        if permanent:
            return
        from prunereg._core.custom import CustomFromMask

        for mixture in self.mixtures:
            for tensor in mixture.tensors:
                fused = getattr(mixture.module, tensor)
                slices = self._by_tensor.get(id(fused), (fused, {}))[1]
                masks = {expert: getattr(layer, MASK) for expert, layer in slices.items() if hasattr(layer, MASK)}
                if not masks:
                    continue
                mask = torch.ones_like(fused, dtype=torch.bool)
                for expert, found in masks.items():
                    mask[expert] = (found.T if mixture.transposed else found).bool()
                CustomFromMask.apply(mixture.module, tensor, mask.to(fused.dtype))


def _routed(forward: Any, by_tensor: Mapping[int, tuple[Tensor, dict[int, ExpertSlice]]]) -> Any:
    """The mixture's forward, run by its eager implementation, with each product of an expert's slice run by that
    expert's layer."""

    def routed(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        with _ToSlices(by_tensor), _eager(module):
            return forward(*args, **kwargs)

    return routed


@contextlib.contextmanager
def _eager(module: nn.Module) -> Iterator[None]:
    """transformers' experts run their own loop over the experts (``experts_implementation="eager"``) inside."""
    config = getattr(module, "config", None)
    held = getattr(config, "_experts_implementation", None)
    if held is None:
        yield
        return
    config._experts_implementation = "eager"  # type: ignore[union-attr]
    try:
        yield
    finally:
        config._experts_implementation = held  # type: ignore[union-attr]


class _ToSlices(TorchFunctionMode):
    """Hands ``F.linear(x, w[e])`` and ``x @ w[e]`` (``w[e]`` a view of a fused ``w``) to expert ``e``'s layer."""

    def __init__(self, by_tensor: Mapping[int, tuple[Tensor, dict[int, ExpertSlice]]]) -> None:
        super().__init__()
        self.by_tensor = by_tensor

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in (F.linear, torch._C._nn.linear) and len(args) >= 2:
            layer = self._slice(args[1])
            if layer is not None:
                out = layer(args[0])
                bias = args[2] if len(args) > 2 else kwargs.get("bias")
                return out if bias is None else out + bias
        elif func in (torch.matmul, Tensor.__matmul__, Tensor.matmul) and len(args) == 2 and not kwargs:
            layer = self._slice(args[1], transposed=True)
            if layer is not None:
                return layer(args[0])
        return func(*args, **kwargs)

    def _slice(self, weight: Any, *, transposed: bool = False) -> ExpertSlice | None:
        """Expert ``e``'s layer where ``weight`` is ``w[e]`` of a fused ``w`` stored as this product reads it."""
        base = getattr(weight, "_base", None)
        if not isinstance(weight, Tensor) or base is None or id(base) not in self.by_tensor:
            return None
        fused, layers = self.by_tensor[id(base)]
        if tuple(weight.shape) != tuple(fused.shape[1:]) or tuple(weight.stride()) != tuple(fused.stride()[1:]):
            return None
        expert, offset = divmod(int(weight.storage_offset()) - int(fused.storage_offset()), int(fused.stride(0)))
        layer = layers.get(expert) if offset == 0 else None
        return layer if layer is not None and layer.transposed == transposed else None
