"""Measuring Wanda's input-feature norms: forward hooks on Linear layers over calibration batches."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


def linear_layers(model: nn.Module, names: Iterable[str] | None = None) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` submodules of ``model`` by qualified name: all of them, or those ``names``."""
    if names is None:
        return {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    modules = dict(model.named_modules())
    chosen = {}
    for name in names:
        if name not in modules:
            raise KeyError(f"{type(model).__name__} has no submodule named {name!r}")
        if not isinstance(modules[name], nn.Linear):
            raise TypeError(f"submodule {name!r} is a {type(modules[name]).__name__}, not an nn.Linear")
        chosen[name] = modules[name]
    return chosen


class InputNorms:
    """Accumulate the L2 norm of every input feature of some Linear layers while a model runs.

    Inside ``with InputNorms(layers) as recorder:``, every forward of a layer
    adds the squares of its inputs, summed over all tokens (every dim but the
    last), to that layer's running total; :meth:`norms` takes the square root.
    The hooks are removed when the block ends, also when it raises.

    >>> with InputNorms(linear_layers(model)) as recorder:
    ...     for batch in calibration_batches:
    ...         model(batch)
    >>> norms = recorder.norms()   # {layer name: (in_features,) tensor}
    """

    def __init__(self, layers: Mapping[str, nn.Linear]) -> None:
        for name, layer in layers.items():
            if not isinstance(layer, nn.Linear):
                raise TypeError(f"layer {name!r} is a {type(layer).__name__}, not an nn.Linear")
        self.layers = dict(layers)
        self.squared_sums: dict[str, torch.Tensor] = {}
        self.tokens: dict[str, int] = dict.fromkeys(self.layers, 0)
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> InputNorms:
        if self._handles:
            raise RuntimeError("InputNorms is already recording")
        try:
            for name, layer in self.layers.items():
                self._handles.append(layer.register_forward_pre_hook(self._recorder(name), with_kwargs=True))
        except BaseException:
            self._remove_hooks()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._remove_hooks()

    def norms(self) -> dict[str, torch.Tensor]:
        """The ``(in_features,)`` L2 norm of each input feature, per layer, over every token seen."""
        unseen = [name for name, count in self.tokens.items() if count == 0]
        if unseen:
            raise RuntimeError(f"no calibration input reached {', '.join(map(repr, unseen))}")
        return {name: total.sqrt() for name, total in self.squared_sums.items()}

    def _recorder(self, name: str) -> Any:
        def record(layer: nn.Linear, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            inputs = (args[0] if args else kwargs["input"]).detach()
            rows = inputs.reshape(-1, inputs.shape[-1])
            squares = rows.to(torch.promote_types(rows.dtype, torch.float32)).square().sum(dim=0)
            total = self.squared_sums.get(name)
            self.squared_sums[name] = squares if total is None else total + squares
            self.tokens[name] += rows.shape[0]

        return record

    def _remove_hooks(self) -> None:
        while self._handles:
            self._handles.pop().remove()
