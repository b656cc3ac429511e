"""What shrinking refuses before it changes anything, and the forward that names the module a failure came from.

Shrinking replaces tensors module by module, so a model whose weights are on
the meta device (nothing to cut) or that shares a module or tensor it would cut
with another place (cut once per place: a shape error, or a tie silently
undone) is refused up front, naming both places. A block's forward is run
inside :func:`failures_named`, which turns a failure in torch's or the model's
words into one line naming the innermost module that was running.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._text import describe


def refuse_meta(model: nn.Module) -> None:
    """Refuse a model holding a tensor on the meta device: it has no values to score or cut."""
    for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, tensor in named:
            if tensor.is_meta:
                raise ValueError(
                    f"the {kind} {name} is on the meta device (no data), and shrink cuts the model's real weights: "
                    "load them first, or shrink the model's folder block by block with prunereg.shrink_folder "
                    "(prunereg shrink --stream)"
                )


def refuse_sharing(model: nn.Module, modules: Iterable[nn.Module], tensors: Iterable[Tensor]) -> None:
    """Refuse when a module or tensor shrinking changes is reachable under two names in ``model``.

    Each place is changed on its own: a module shared by two blocks would be cut
    twice, a Parameter shared by two places would come out as two untied copies.
    """
    shared = _held_twice(modules, model.named_modules(remove_duplicate=False))
    if shared is not None:
        module, first, second = shared
        raise ValueError(
            f"{first} and {second} are one {type(module).__name__} object, which shrink would change once for each "
            "place: give each place its own copy (copy.deepcopy) first"
        )
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    shared = _held_twice(tensors, named)
    if shared is not None:
        _, first, second = shared
        raise ValueError(
            f"{first} and {second} are one tensor (tied), which shrink would cut into two untied copies: "
            "untie them first (give each its own nn.Parameter)"
        )


def _held_twice(objects: Iterable[Any], named: Iterable[tuple[str, Any]]) -> tuple[Any, str, str] | None:
    """The first of ``objects`` that ``named`` lists under two names, with those names; None if none is."""
    names: dict[int, list[str]] = {}
    for name, value in named:
        names.setdefault(id(value), []).append(name)
    for value in objects:
        places = names.get(id(value), [])
        if len(places) > 1:
            return value, places[0], places[1]
    return None


@contextlib.contextmanager
def failures_named(root: nn.Module, root_name: str, message: Callable[[str, str], str]) -> Iterator[None]:
    """Run forwards of ``root`` (named ``root_name``) that, on failure, raise one ``ValueError`` line.

    ``message(module, error)`` words it from the innermost module that was
    running (``root_name.sub.module``) and the error in one line. Running out
    of memory is not the model's fault and passes unchanged, as does Ctrl-C.
    """
    tracker = _InnermostModule(root, root_name)
    try:
        with tracker:
            yield
    except (MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as error:
        raise ValueError(message(tracker.innermost(), describe(error))) from error


class _InnermostModule:
    """Hooks on every module under a root that keep the stack of modules whose forward is running.

    The entry hook runs before any other pre-hook and the exit hook after the
    others, so a failing hook counts as its module's failure: after an error,
    the top of the stack is the module that raised.
    """

    def __init__(self, root: nn.Module, root_name: str) -> None:
        self.root = root
        self.root_name = root_name
        self.names = {id(module): f"{root_name}.{name}" if name else root_name for name, module in root.named_modules()}
        self.stack: list[str] = []
        self.handles: list[Any] = []

    def __enter__(self) -> _InnermostModule:
        for module in self.root.modules():
            self.handles.append(module.register_forward_pre_hook(self._enter, prepend=True))
            self.handles.append(module.register_forward_hook(self._leave))
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def innermost(self) -> str:
        return self.stack[-1] if self.stack else self.root_name

    def _enter(self, module: nn.Module, args: Any) -> None:
        if module is self.root:  # a new forward: what an earlier one left (a forward stopped on purpose) goes
            self.stack.clear()
        self.stack.append(self.names[id(module)])

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        name = self.names[id(module)]
        while self.stack and self.stack.pop() != name:
            pass
