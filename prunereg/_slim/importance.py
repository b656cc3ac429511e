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

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor, nn

from prunereg._plugins.isolation import guard_plugin_methods
from prunereg._slim.units import Group, TensorDim

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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A third party's importance runs as plugin code: sys.exit() or its own Ctrl-C fails like any error.
        guard_plugin_methods(cls, ("__init__", "prepare", "__call__"))

    def prepare(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Look at the model before scoring (nothing by default)."""

    def __call__(self, group: Group, values: Mapping[str, Tensor]) -> Tensor:
        raise NotImplementedError


def unit_sums(group: Group, values: Mapping[str, Tensor], measure: Callable[[Tensor], Tensor]) -> Tensor:
    """Per unit of ``group``: the sum of ``measure(tensor)`` over every entry the unit holds, in float64.

    ``measure`` is per entry: it sees each tensor (a large one a slice of rows at a time)
    in float32 (or float64; a half-precision tensor is widened first, exactly); the
    per-unit sums are float64.
    """
    return DimensionSums(measure).unit_sums(group, values)


MEASURED_AT_ONCE = 1 << 24
"""Most entries measured at once: a larger tensor (a large vocabulary's embedding) is measured a slice of rows at a
time, so that its widened float32 copy and its measure never take more than 16 MiB each, not twice its own bytes."""


class DimensionSums:
    """Per tensor name: the sums of a per-entry measure along each dimension, each tensor measured once.

    A tensor sits in several groups (a Linear's rows in one, its columns in
    another), so the measure (a square, a product) is taken once per name and
    kept only as its sums along every dimension: one vector per dimension, never
    a second copy of the weights. Keyed by name, never by object identity (the
    id of a temporary copy is reused once it is freed); a name is measured again
    when ``values`` holds another tensor under it.
    """

    def __init__(self, measure: Callable[[Tensor], Tensor]) -> None:
        self.measure = measure
        self._sums: dict[str, list[Tensor]] = {}
        self._measured: dict[str, Tensor] = {}  # the tensor of ``values`` each name's sums were taken of

    def clear(self) -> None:
        self._sums, self._measured = {}, {}

    def add(self, name: str, tensor: Tensor) -> None:
        """Measure ``tensor`` as ``name``'s values now, a slice of rows at a time (see :data:`MEASURED_AT_ONCE`)."""
        if tensor.dim() <= 1 or tensor.numel() <= MEASURED_AT_ONCE:
            self._sums[name] = _sums_along_each(self.measure(_widened(tensor)))
            return
        rows = max(1, MEASURED_AT_ONCE // (tensor.numel() // tensor.shape[0]))
        firsts: list[Tensor] = []
        others: list[Tensor] = []
        for start in range(0, tensor.shape[0], rows):
            first, *sums = _sums_along_each(self.measure(_widened(tensor[start : start + rows])))
            firsts.append(first)
            sums = [part.double() for part in sums]
            others = sums if not others else [total + part for total, part in zip(others, sums, strict=True)]
        self._sums[name] = [torch.cat(firsts), *others]

    def unit_sums(self, group: Group, values: Mapping[str, Tensor] | None = None) -> Tensor:
        """Per unit of ``group``: the measure summed over the unit's entries (float64).

        With ``values``: of the tensors ``values`` holds, measured as they are there;
        without: of the tensors added.
        """
        sums: dict[TensorDim, Tensor] = {}
        for name, dim in group.members:
            if values is not None:
                if name not in values:
                    continue
                if self._measured.get(name) is not values[name]:  # two live tensors compared: no id kept as a key
                    self.add(name, values[name])
                    self._measured[name] = values[name]
            if name in self._sums:
                sums[name, dim] = self._sums[name][dim]
        return _add_per_unit(group, sums)


def _widened(tensor: Tensor) -> Tensor:
    """``tensor`` in float32 or float64: every half-precision value is exactly a float32 value."""
    return tensor if tensor.dtype in (torch.float64, torch.float32) else tensor.float()


def _sums_along_each(entries: Tensor) -> list[Tensor]:
    """For each dimension of ``entries`` in turn, the sums over every other dimension.

    Two passes over ``entries`` whatever its rank: the first two dimensions'
    sums come from its sums over the rest (a convolution's rows and columns from
    its kernels' totals), the rest from its sums over the first two.
    """
    if entries.dim() <= 1:
        return [entries]
    if entries.dim() == 2:
        return [entries.sum(1), entries.sum(0)]
    leading = entries.sum(dim=tuple(range(2, entries.dim())))
    return [*_sums_along_each(leading), *_sums_along_each(entries.sum(dim=(0, 1)))]


def _add_per_unit(group: Group, sums: Mapping[TensorDim, Tensor]) -> Tensor:
    scores = torch.zeros(group.size, dtype=torch.float64)
    for key, unit_index in group.members.items():
        if key in sums:
            scores.index_add_(0, unit_index, sums[key].to(device="cpu", dtype=torch.float64))
    return scores


class MagnitudeImportance(Importance):
    """The L2 norm of everything a unit holds, across all its coupled layers (group magnitude)."""

    def __init__(self) -> None:
        self._squares = DimensionSums(torch.square)

    def prepare(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._squares.clear()

    def __call__(self, group: Group, values: Mapping[str, Tensor]) -> Tensor:
        return self._squares.unit_sums(group, values).sqrt()


class RandomImportance(Importance):
    """Random scores (``torch.rand``: seed with ``torch.manual_seed``), the baseline to beat."""

    def __call__(self, group: Group, values: Mapping[str, Tensor]) -> Tensor:
        return torch.rand(group.size, dtype=torch.float64)


class TaylorImportance(Importance):
    """First-order Taylor: ``|weight x gradient|`` summed over a unit.

    The gradient is of ``loss(output)`` on the example inputs, ``loss``
    defaulting to the sum of every floating-point tensor in the output; with
    ``batches`` (inputs as ``example_inputs`` takes them: a tensor, a tuple or a
    dict of keyword inputs, such as calibration text with its labels), of the
    sum of the losses on them instead, one backward per batch. The model's own
    ``.grad`` and ``requires_grad`` are left as they were.
    """

    def __init__(self, loss: Callable[[Any], Tensor] | None = None, batches: Iterable[Any] | None = None) -> None:
        self.loss = loss
        self.batches = None if batches is None else list(batches)
        self._products = DimensionSums(torch.abs)

    def prepare(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        from prunereg._slim.graph import leaves_no_state  # the graph's imports stay out of the toolkit's

        parameters = dict(model.named_parameters(remove_duplicate=False))
        saved = {name: (p.grad, p.requires_grad) for name, p in parameters.items()}
        inputs = [(args, kwargs)] if self.batches is None else [_as_call(batch) for batch in self.batches]
        try:
            for p in parameters.values():
                p.grad = None
                p.requires_grad_(True)
            with torch.enable_grad(), leaves_no_state(model, tensors=False):
                for batch_args, batch_kwargs in inputs:  # gradients add up over the batches
                    output = model(*batch_args, **batch_kwargs)
                    loss = self.loss(output) if self.loss is not None else _output_sum(output)
                    loss.backward()
            self._products.clear()
            for name, p in parameters.items():
                if p.grad is not None:  # widened first: a half-precision product would round
                    self._products.add(name, _widened(p.detach()) * _widened(p.grad))
        finally:
            for name, p in parameters.items():
                p.grad, requires_grad = saved[name]
                p.requires_grad_(requires_grad)

    def __call__(self, group: Group, values: Mapping[str, Tensor]) -> Tensor:
        return self._products.unit_sums(group)


def _as_call(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A batch as positional and keyword inputs: a tensor, a tuple of inputs or a dict of keyword inputs."""
    if isinstance(batch, Mapping):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    return (batch,), {}


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
    plugin's importance holds, as it does for methods, and a name of another
    kind even with ``replace=True`` (``magnitude`` is also the calibrated
    method: pass an instance, ``importance=MyMagnitude()``, instead).
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
