"""Importances: how the units of a dependency group are scored, the lowest removed first.

Built in: ``magnitude`` (the L2 norm of every parameter entry a unit holds,
across all its coupled layers, as Torch-Pruning's group magnitude), ``random``
and ``taylor`` (first-order Taylor: ``|weight x gradient|`` summed over the
unit, the gradient of the output's sum on the example inputs, or of a loss
you give). Others register by name with :func:`register_importance`, in this
process, or from an installed plugin as methods of kind ``importance`` do
(``register("name", "pkg.module:Class", kind="importance", ...)``): an
importance is a subclass of :class:`Importance` with
``PRUNING_TYPE = "importance"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor, nn

from prunereg._slim.groups import Group

_Class = TypeVar("_Class", bound=type)


class Importance:
    """Scores the units of a dependency group: higher scores are kept.

    ``prepare`` runs once per :func:`prunereg.slim` call, before any group is
    scored (a gradient importance runs the model there); ``__call__`` returns
    one score per unit of ``group``. ``values`` maps every parameter name the
    graph knows to its current value (a pruned tensor's masked value under its
    ``_orig`` name); :func:`unit_sums` adds any per-entry measure up per unit.
    """

    PRUNING_TYPE: ClassVar[str] = "importance"

    def prepare(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Look at the model before scoring (nothing by default)."""

    def __call__(self, group: Group, values: Mapping[str, Tensor]) -> Tensor:
        raise NotImplementedError


def unit_sums(group: Group, values: Mapping[str, Tensor], measure: Callable[[Tensor], Tensor]) -> Tensor:
    """Per unit of ``group``: the sum of ``measure(tensor)`` over every entry the unit holds, in float64.

    ``measure`` sees each tensor in float32 (or float64); the per-unit sums are float64.
    """
    scores = torch.zeros(group.size, dtype=torch.float64)
    for (name, dim), unit_index in group.members.items():
        tensor = values.get(name)
        if tensor is None:
            continue
        entries = measure(tensor if tensor.dtype in (torch.float64, torch.float32) else tensor.float())
        if entries.dim() > 1:
            entries = entries.sum(dim=[d for d in range(entries.dim()) if d != dim])
        scores.index_add_(0, unit_index, entries.to(device="cpu", dtype=torch.float64))
    return scores


class MagnitudeImportance(Importance):
    """The L2 norm of everything a unit holds, across all its coupled layers (group magnitude)."""

    def __init__(self) -> None:
        self._squares: dict[int, Tensor] = {}

    def prepare(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._squares = {}

    def __call__(self, group: Group, values: Mapping[str, Tensor]) -> Tensor:
        return unit_sums(group, values, self._square).sqrt()

    def _square(self, tensor: Tensor) -> Tensor:
        # a tensor is in two groups (rows and columns): squared once; keyed by identity, kept alive by values
        found = self._squares.get(id(tensor))
        if found is None:
            found = self._squares[id(tensor)] = tensor * tensor
        return found


class RandomImportance(Importance):
    """Random scores (``torch.rand``: seed with ``torch.manual_seed``), the baseline to beat."""

    def __call__(self, group: Group, values: Mapping[str, Tensor]) -> Tensor:
        return torch.rand(group.size, dtype=torch.float64)


class TaylorImportance(Importance):
    """First-order Taylor: ``|weight x gradient|`` summed over a unit.

    The gradient is of ``loss(output)`` on the example inputs, ``loss``
    defaulting to the sum of every floating-point tensor in the output. The
    model's own ``.grad`` and ``requires_grad`` are left as they were.
    """

    def __init__(self, loss: Callable[[Any], Tensor] | None = None) -> None:
        self.loss = loss
        self._products: dict[str, Tensor] = {}

    def prepare(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        parameters = dict(model.named_parameters(remove_duplicate=False))
        saved = {name: (p.grad, p.requires_grad) for name, p in parameters.items()}
        try:
            for p in parameters.values():
                p.grad = None
                p.requires_grad_(True)
            with torch.enable_grad():
                output = model(*args, **kwargs)
                loss = self.loss(output) if self.loss is not None else _output_sum(output)
                loss.backward()
            self._products = {name: (p.detach() * p.grad).abs() for name, p in parameters.items() if p.grad is not None}
        finally:
            for name, p in parameters.items():
                p.grad, requires_grad = saved[name]
                p.requires_grad_(requires_grad)

    def __call__(self, group: Group, values: Mapping[str, Tensor]) -> Tensor:
        return unit_sums(group, self._products, lambda t: t)


def _output_sum(output: Any) -> Tensor:
    tensors = [t for t in _tensors(output) if t.is_floating_point() and t.requires_grad]
    if not tensors:
        raise ValueError("taylor importance needs an output that depends on the parameters; pass loss=")
    return sum((t.sum() for t in tensors), torch.zeros((), device=tensors[0].device))


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if hasattr(value, "to_tuple"):  # transformers' ModelOutput
        return _tensors(value.to_tuple())
    return []


_BUILTIN: dict[str, type[Importance]] = {
    "magnitude": MagnitudeImportance,
    "random": RandomImportance,
    "taylor": TaylorImportance,
}


def register_importance(name: str, *, replace: bool = False) -> Callable[[_Class], _Class]:
    """Class decorator: make an :class:`Importance` subclass available as ``slim(..., importance=name)``.

    The same as ``prunereg.register(name, kind="importance")``: the importance
    joins the method registry as kind ``importance`` (``prunereg list
    --kind importance`` shows it), in this process, or for the plugin whose
    import is running. Taking a built-in importance's name needs
    ``replace=True``, else ``ValueError``; the registry refuses a name another
    method or importance holds, as it does for methods.
    """

    def decorate(cls: _Class) -> _Class:
        if not (isinstance(cls, type) and issubclass(cls, Importance)):
            raise TypeError(f"{cls!r} is not a prunereg.Importance subclass")
        if name in _BUILTIN and not replace:
            raise ValueError(f"importance {name!r} is already registered; pass replace=True to redefine it")
        from prunereg._plugins.loading import register_local

        summary = "".join((cls.__doc__ or "").strip().splitlines()[:1]) or f"The importance {name}"
        register_local(cls, name, kind="importance", summary=summary, replace=replace)
        return cls

    return decorate


def importance_names() -> list[str]:
    """Every importance :func:`prunereg.slim` knows by name: built-in and registered."""
    from prunereg._plugins.loading import registry

    return sorted({*_BUILTIN, *registry().names("importance")})


def get_importance(name: str) -> type[Importance]:
    """The :class:`Importance` subclass called ``name`` (a registered one first, then the built-ins).

    ``ValueError`` naming the known importances if there is none.
    """
    from prunereg._plugins.loading import registry

    if name in registry().names("importance"):
        cls = registry().resolve(name)
        if isinstance(cls, type) and issubclass(cls, Importance):
            return cls
    if name in _BUILTIN:
        return _BUILTIN[name]
    raise ValueError(f"unknown importance {name!r}; known: {', '.join(importance_names())}")


def resolve_importance(importance: str | Importance) -> Importance:
    """An importance instance from a name (built with no arguments) or an instance."""
    if isinstance(importance, Importance):
        return importance
    if isinstance(importance, str):
        return get_importance(importance)()
    raise TypeError(f"importance must be a name or a prunereg.Importance, not {type(importance).__name__}")
