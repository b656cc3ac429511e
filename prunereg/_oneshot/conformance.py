"""The conformance check for calibrated methods, exported as ``prunereg.testing.check_calibrated_method``."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch

from prunereg._oneshot.contract import FIELDS, SITE, CalibratedMethod, LayerStatistics
from prunereg._runtime.conformance import default_devices, sampled, step
from prunereg._runtime.registry import at_site, statistic_names
from prunereg._runtime.statistics import Observation

_SEED = 1234
_IN_FEATURES = 16
_OUT_FEATURES = (6, 4)  # two layers reading one input, as q/k/v or gate/up do
_SPARSITIES = (0.5, 0.25)


def check_calibrated_method(method: str | type, /, *, devices: Sequence[str] | None = None, **kwargs: Any) -> None:
    """Check that a calibrated method keeps the contract :func:`prunereg.oneshot` relies on.

    ``method`` is a registered name or a :class:`prunereg.CalibratedMethod`
    subclass; ``kwargs`` go to its constructor (besides ``sparsity`` and
    ``pattern``, which the check sets). Checked on each of ``devices`` (default:
    cpu, and cuda when present), for a group of two layers reading one input:

    - the class: a ``CalibratedMethod`` of kind ``calibrated`` (the registered kind,
      for a name) whose ``STATISTICS`` are registered statistics of a layer's input
      (one a plugin registered is gathered over the check's random tokens);
    - the constructor: ``sparsity`` outside [0, 1) is a ``ValueError``, a
      non-number a ``TypeError``, and a pattern whose N/M differs from the sparsity
      a ``ValueError``;
    - ``prune_group``: one ``PrunedWeight`` per layer, the weight float32 of the
      layer's shape and device, the mask bool of that shape, the weight exactly zero
      where the mask is False; each layer pruned to its own sparsity (within one
      entry per row); kept weights unchanged unless ``UPDATES_WEIGHTS``; sparsity 0
      prunes nothing; the same result for the same input; its inputs unchanged;
    - with ``pattern="2:4"``: exactly 2 of every 4 consecutive inputs of a row pruned.

    Raises ``AssertionError`` naming the method, the check and the device.
    """
    cls, label = _method_class(method)
    with step(label, "constructor argument checks"):
        _check_constructor(cls, kwargs)
    for device in devices if devices is not None else default_devices():
        weights, statistics = _group(device, cls.STATISTICS)
        with step(label, f"unstructured pruning on {device}"):
            _check_unstructured(cls, kwargs, weights, statistics)
        with step(label, f"2:4 pruning on {device}"):
            _check_two_of_four(cls, kwargs, weights, statistics)


def _method_class(method: str | type) -> tuple[type[CalibratedMethod], str]:
    if isinstance(method, str):
        from prunereg._plugins.loading import registry

        info = registry().info(method)
        cls = registry().resolve(method)
        label = f"calibrated method {method!r} ({info.target})"
        if info.kind != "calibrated":
            raise AssertionError(f"{label}: registered as kind {info.kind!r}, not 'calibrated'")
    else:
        cls, label = method, f"calibrated method {getattr(method, '__qualname__', method)!r}"
    if not (isinstance(cls, type) and issubclass(cls, CalibratedMethod)):
        raise AssertionError(f"{label}: not a prunereg.CalibratedMethod subclass")
    if cls.PRUNING_TYPE != "calibrated":
        raise AssertionError(f"{label}: PRUNING_TYPE must be 'calibrated', not {cls.PRUNING_TYPE!r}")
    gathered = at_site(set(cls.STATISTICS) & statistic_names(), SITE)
    if set(gathered) != set(cls.STATISTICS):
        raise AssertionError(f"{label}: STATISTICS must name registered statistics observed at {SITE!r}")
    return cls, label


def _check_constructor(cls: type[CalibratedMethod], kwargs: dict[str, Any]) -> None:
    wrong: list[tuple[Any, type[Exception]]] = [(1.0, ValueError), (-0.1, ValueError), ("half", TypeError)]
    for bad, error in wrong:
        try:
            cls(sparsity=bad, **kwargs)
        except error:
            continue
        except Exception as other:
            raise AssertionError(f"sparsity={bad!r} raised {type(other).__name__}, expected {error.__name__}") from None
        raise AssertionError(f"sparsity={bad!r} was accepted; expected {error.__name__}")
    try:
        cls(sparsity=0.3, pattern="2:4", **kwargs)
    except ValueError:
        return
    raise AssertionError("pattern='2:4' with sparsity=0.3 was accepted; expected ValueError")


def _group(device: str, names: Collection[str]) -> tuple[list[torch.Tensor], LayerStatistics]:
    """Two random layers reading one input, and that input's statistics (``names`` too) from 64 random tokens."""
    generator = torch.Generator().manual_seed(_SEED)
    tokens = torch.randn(64, _IN_FEATURES, generator=generator) * torch.linspace(0.2, 3.0, _IN_FEATURES)
    weights = [torch.randn(out, _IN_FEATURES, generator=generator).to(device) for out in _OUT_FEATURES]
    statistics = LayerStatistics(
        n_tokens=tokens.shape[0],
        input_sq_norms=tokens.square().sum(0).to(device),
        hessian=(2 / tokens.shape[0] * tokens.T @ tokens).to(device),
        extra=sampled(names, SITE, Observation(0, tokens.to(device)), leave_out=FIELDS),
    )
    return weights, statistics


def _prune(
    method: CalibratedMethod, weights: list[torch.Tensor], statistics: LayerStatistics, sparsities: Sequence[float]
) -> list[Any]:
    copies = [w.clone() for w in weights]
    stats_copies = [t.clone() if t is not None else None for t in (statistics.input_sq_norms, statistics.hessian)]
    results = list(method.prune_group(weights, statistics, list(sparsities)))
    if any(not torch.equal(w, c) for w, c in zip(weights, copies, strict=True)):
        raise AssertionError("prune_group changed the weights it was given")
    for given, kept in zip((statistics.input_sq_norms, statistics.hessian), stats_copies, strict=True):
        if given is not None and kept is not None and not torch.equal(given, kept):
            raise AssertionError("prune_group changed the statistics it was given")
    if len(results) != len(weights):
        raise AssertionError(f"prune_group returned {len(results)} results for {len(weights)} weights")
    for weight, result in zip(weights, results, strict=True):
        new, mask = result
        if new.shape != weight.shape or new.dtype != torch.float32 or new.device != weight.device:
            raise AssertionError(f"a new weight must be float32 {tuple(weight.shape)} on {weight.device}, "
                                 f"got {new.dtype} {tuple(new.shape)} on {new.device}")  # fmt: skip
        if mask.dtype != torch.bool or mask.shape != weight.shape:
            raise AssertionError(f"a mask must be bool {tuple(weight.shape)}, got {mask.dtype} {tuple(mask.shape)}")
        if (new[~mask] != 0).any():
            raise AssertionError("a new weight is not zero everywhere its mask is False")
        if not type(method).UPDATES_WEIGHTS and not torch.equal(new[mask], weight[mask]):
            raise AssertionError("kept weights changed, but UPDATES_WEIGHTS is False")
    return results


def _check_unstructured(
    cls: type[CalibratedMethod], kwargs: dict[str, Any], weights: list[torch.Tensor], statistics: LayerStatistics
) -> None:
    method = cls(sparsity=0.5, **kwargs)
    results = _prune(method, weights, statistics, _SPARSITIES)
    for weight, (_, mask), target in zip(weights, results, _SPARSITIES, strict=True):
        pruned = 1 - mask.float().mean().item()
        if abs(pruned - target) > 1 / weight.shape[1] + 1e-6:
            raise AssertionError(f"a layer with target sparsity {target} was pruned to {pruned:.3f}")
    again = _prune(method, weights, statistics, _SPARSITIES)
    if any(
        not (torch.equal(a.mask, b.mask) and torch.equal(a.weight, b.weight))
        for a, b in zip(results, again, strict=True)
    ):
        raise AssertionError("two calls on the same input gave different results")
    untouched = _prune(method, weights, statistics, [0.0] * len(weights))
    if any(not bool(result.mask.all()) for result in untouched):
        raise AssertionError("sparsity 0 pruned some weights")


def _check_two_of_four(
    cls: type[CalibratedMethod], kwargs: dict[str, Any], weights: list[torch.Tensor], statistics: LayerStatistics
) -> None:
    method = cls(sparsity=0.5, pattern="2:4", **kwargs)
    for _, mask in _prune(method, weights, statistics, [0.5] * len(weights)):
        pruned_per_group = (~mask).reshape(mask.shape[0], -1, 4).sum(-1)
        if not bool((pruned_per_group == 2).all()):
            raise AssertionError("some group of 4 consecutive inputs does not have exactly 2 pruned")
