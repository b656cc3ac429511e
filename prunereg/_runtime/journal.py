"""What a run replaced in a model's modules, so that a failure midway can put the model back.

Each module is remembered once, before its first change: its parameters,
buffers and plain attributes as they were (the tensors themselves, not copies:
a run replaces tensors rather than writing into them), and the contents of any
``nn.ModuleList`` it reorders.
"""

from __future__ import annotations

from typing import Any

from torch import nn


class Journal:
    """What removal replaced (tensors, size attributes), so that a failed shrink can put the model back.

    A journal made with ``enabled=False`` keeps nothing (streaming: a failed run
    leaves no output folder, and each block's old tensors must be freed).
    """

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._entries: list[tuple[nn.Module, dict[str, Any], dict[str, Any], dict[str, Any]]] = []
        self._seen: set[int] = set()
        self.lists: list[tuple[nn.ModuleList, list[nn.Module]]] = []

    def keep(self, module: nn.Module) -> None:
        """Remember ``module``'s tensors and plain attributes as they are now (once per module)."""
        if not self.enabled or id(module) in self._seen:
            return
        self._seen.add(id(module))
        plain = {k: v for k, v in vars(module).items() if not k.startswith("_")}
        self._entries.append((module, dict(module._parameters), dict(module._buffers), plain))

    def restore(self) -> None:
        for module, parameters, buffers, plain in reversed(self._entries):
            module._parameters.clear()
            module._parameters.update(parameters)
            module._buffers.clear()
            module._buffers.update(buffers)
            for key, value in plain.items():
                object.__setattr__(module, key, value)
        for module_list, modules in self.lists:
            for key in list(module_list._modules):
                del module_list._modules[key]
            for index, module in enumerate(modules):
                module_list._modules[str(index)] = module
