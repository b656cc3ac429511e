"""The conformance check for importances, exported as ``prunereg.testing.check_importance``."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._slim.attempt import parameter_values
from prunereg._slim.engine import slim
from prunereg._slim.graph import build_graph, capture_model
from prunereg._slim.groups import find_groups
from prunereg._slim.importance import Importance, get_importance

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_SEED = 1234


class _Residual(nn.Module):
    """A residual stream (8 channels, a norm on it) and an MLP's inner width (12): two groups to score."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8)
        self.up = nn.Linear(8, 12)
        self.down = nn.Linear(12, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        h = h + self.down(torch.relu(self.up(self.norm(h))))
        return self.head(h)


def check_importance(
    importance: str | type | Importance, /, *, dtypes: Sequence[torch.dtype] = DTYPES, **kwargs: Any
) -> None:
    """Check that an importance keeps the contract :func:`prunereg.slim` relies on.

    ``importance`` is a name (built in or registered), an
    :class:`prunereg.Importance` subclass (built with ``kwargs``) or an
    instance. On a small residual model, in every one of ``dtypes``:

    - the class: an ``Importance`` with ``PRUNING_TYPE = "importance"`` (a
      registered name: of kind ``importance``, with a summary);
    - ``prepare`` then ``__call__(group, values)`` for every group: a floating
      tensor of shape ``(group.size,)``, not on the meta device; the values, and
      the model's parameters, gradients, ``requires_grad`` and modes, unchanged;
      the same scores for the same seed;
    - ``prunereg.slim(model, x, ratio=0.5, importance=it)`` removes channels
      and keeps the output's shape.

    Raises ``AssertionError`` naming the importance, the check and the dtype.
    """
    instance, label = _instance(importance, kwargs)
    torch.manual_seed(0)
    model, x = _Residual().eval(), torch.randn(4, 6)
    graph = build_graph(model, capture_model(model, (x,), {}))
    groups = find_groups(graph)
    for dtype in dtypes:
        typed, inputs = copy.deepcopy(model).to(dtype), x.to(dtype)
        values = parameter_values(typed, graph)
        before = _state(typed, values)
        with step(label, f"scoring in {dtype}"):
            first = _scores(instance, typed, inputs, groups, values)
            again = _scores(instance, typed, inputs, groups, values)
        for group, scores, repeated in zip(groups, first, again, strict=True):
            _check_scores(label, dtype, group.size, scores, repeated)
        if not _same_state(before, _state(typed, values)):
            raise AssertionError(
                f"{label} ({dtype}): prepare or scoring changed the model (a parameter, a gradient, requires_grad, "
                "a mode) or the values it was given; an importance only reads them"
            )
    slimmed = copy.deepcopy(model)
    with step(label, "slimming with ratio=0.5"), _quiet():
        report = slim(slimmed, x, ratio=0.5, importance=instance)
    if report.removed == 0 or slimmed(x).shape != model(x).shape:
        raise AssertionError(f"{label}: slim(ratio=0.5) removed {report.removed} units or changed the output shape")


def _instance(importance: str | type | Importance, kwargs: dict[str, Any]) -> tuple[Importance, str]:
    if isinstance(importance, Importance):
        if kwargs:
            raise TypeError("keyword arguments build an importance from its name or class, not from an instance")
        return importance, f"importance {type(importance).__qualname__}"
    if isinstance(importance, str):
        label = f"importance {importance!r}"
        with step(label, "looking it up"):
            cls: Any = get_importance(importance)
        _check_registration(importance, label)
    else:
        cls, label = importance, f"importance {getattr(importance, '__qualname__', importance)!r}"
    if not (isinstance(cls, type) and issubclass(cls, Importance)):
        raise AssertionError(f"{label}: not a prunereg.Importance subclass")
    if cls.PRUNING_TYPE != "importance":
        raise AssertionError(f"{label}: PRUNING_TYPE must be 'importance', not {cls.PRUNING_TYPE!r}")
    with step(label, "constructing it"):
        return cls(**kwargs), label


def _check_registration(name: str, label: str) -> None:
    from prunereg._plugins.loading import registry

    if name not in registry().names("importance"):
        return  # a built-in importance: no registration
    if not registry().info(name).summary.strip():
        raise AssertionError(f"{label}: registered with an empty summary")


def _scores(
    importance: Importance, model: nn.Module, x: Tensor, groups: list[Any], values: dict[str, Tensor]
) -> list[Any]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        importance.prepare(model, (x,), {})
        return [importance(group, values) for group in groups]


def _check_scores(label: str, dtype: torch.dtype, size: int, scores: Any, repeated: Any) -> None:
    where = f"{label} ({dtype})"
    if not isinstance(scores, Tensor) or tuple(scores.shape) != (size,):
        shape = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise AssertionError(f"{where}: must return one score per unit, a tensor of shape ({size},), not {shape}")
    if not scores.is_floating_point() or scores.is_meta:
        raise AssertionError(
            f"{where}: scores must be a floating tensor with values, not {scores.dtype} on {scores.device}"
        )
    if not (isinstance(repeated, Tensor) and _equal(scores, repeated)):
        raise AssertionError(f"{where}: the same seed gave other scores")


def _state(model: nn.Module, values: dict[str, Tensor]) -> list[Any]:
    parameters = list(model.named_parameters(remove_duplicate=False))
    return [
        [
            (name, p.detach().clone(), None if p.grad is None else p.grad.clone(), p.requires_grad)
            for name, p in parameters
        ],
        [m.training for m in model.modules()],
        {name: value.clone() for name, value in values.items()},
    ]


def _copy(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.clone()


def _same_state(before: list[Any], after: list[Any]) -> bool:
    def same(a: Any, b: Any) -> bool:
        if isinstance(a, Tensor) and isinstance(b, Tensor):
            return _equal(a, b)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        return bool(a == b)

    return same(before, after)


def _equal(a: Tensor, b: Tensor) -> bool:
    """Same dtype, shape and values, NaN equal to NaN."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.isnan(), b.isnan())
        and torch.equal(a.nan_to_num(), b.nan_to_num())
    )


@contextlib.contextmanager
def step(label: str, what: str) -> Iterator[None]:
    """An exception raised by the importance as an AssertionError that says what was being done."""
    try:
        yield
    except AssertionError:
        raise
    except Exception as error:
        raise AssertionError(f"{label}: failed while {what}: {type(error).__name__}: {error}") from error


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Slimming's warnings (a module kept whole) are not the importance's to answer for."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
