"""The conformance check for shrink methods, exported as ``prunereg.testing.check_shrink_method``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from prunereg._runtime.conformance import default_devices, method_class, sampled, step
from prunereg._runtime.registry import statistic_names
from prunereg._runtime.statistics import Observation
from prunereg._shrink.contract import (
    SITE_OF,
    TARGET_NAMES,
    BlockStatistics,
    ChannelStatistics,
    ExpertStatistics,
    ShrinkMethod,
)

_SEED = 1234
_OUT, _IN, _EXPERTS = 12, 20, 6


def check_shrink_method(method: str | type, /, *, devices: Sequence[str] | None = None, **kwargs: Any) -> None:
    """Check that a shrink method keeps the contract :func:`prunereg.shrink` relies on.

    ``method`` is a registered name or a :class:`prunereg.ShrinkMethod` subclass;
    ``kwargs`` go to its constructor. Checked on each of ``devices`` (default: cpu,
    and cuda when present), for every target in the class's ``TARGETS``:

    - the class: a ``ShrinkMethod`` of kind ``shrink`` (the registered kind, for a
      name) that scores at least one target, with ``TARGETS`` the engine knows and
      ``STATISTICS`` registered (one a plugin registered is gathered over the
      check's random data), and ``ALLOCATES_ACROSS_BLOCKS`` a bool, true only for
      a channel method;
    - ``channel_scores``: one finite score per input channel of the weight, on its
      device; the same result for the same input; the weight and statistics unchanged;
      ``unit_scores``: one finite score per unit, for MLP channels and for heads;
    - ``block_score``: a finite float, the same for the same statistics;
    - ``expert_scores``: one finite score per expert, the same for the same statistics.

    Raises ``AssertionError`` naming the method, the check and the device.
    """
    cls, label = _method_class(method)
    with step(label, "constructor"):
        try:
            instance = cls(**kwargs)
        except Exception as error:
            raise AssertionError(f"{cls.__name__}(**{kwargs!r}) raised {type(error).__name__}: {error}") from None
    for device in devices if devices is not None else default_devices():
        for target in sorted(cls.TARGETS):
            with step(label, f"{target} scores on {device}"):
                {"channels": _check_channels, "blocks": _check_blocks, "experts": _check_experts}[target](
                    instance, device
                )


def _method_class(method: str | type) -> tuple[type[ShrinkMethod], str]:
    cls, label = method_class(method, ShrinkMethod, "shrink method")
    if not cls.TARGETS or not set(cls.TARGETS) <= TARGET_NAMES:
        raise AssertionError(f"{label}: TARGETS must be a non-empty subset of {sorted(TARGET_NAMES)}")
    if not set(cls.STATISTICS) <= statistic_names():
        raise AssertionError(f"{label}: STATISTICS must name registered statistics")
    for flag in ("ALLOCATES_ACROSS_BLOCKS", "OBSERVES_DENSE_MODEL"):
        if not isinstance(getattr(cls, flag), bool):
            raise AssertionError(f"{label}: {flag} must be True or False")
    if cls.ALLOCATES_ACROSS_BLOCKS and "channels" not in cls.TARGETS:
        raise AssertionError(f"{label}: ALLOCATES_ACROSS_BLOCKS ranks channel scores, and it scores no channels")
    return cls, label


def _check_channels(method: ShrinkMethod, device: str) -> None:
    generator = torch.Generator().manual_seed(_SEED)
    tokens = torch.randn(64, _IN, generator=generator, dtype=torch.float64)
    weight = torch.randn(_OUT, _IN, generator=generator).to(device)
    statistics = ChannelStatistics(
        tokens.shape[0],
        tokens.square().sum(0).float().to(device),
        tokens.mean(0).float().to(device),
        tokens.var(0).float().to(device),
        _sampled(method, "channels", Observation(0, tokens.float().to(device)), "channel_moments"),
    )
    copies = [t.clone() for t in (weight, statistics.sq_norms, statistics.mean, statistics.variance) if t is not None]
    scores = method.channel_scores(weight, statistics)
    if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != (_IN,):
        raise AssertionError(f"channel_scores must return a tensor of shape ({_IN},), got {_describe(scores)}")
    if scores.device != weight.device:
        raise AssertionError(f"channel_scores returned scores on {scores.device}, the weight is on {weight.device}")
    if not bool(torch.isfinite(scores).all()):
        raise AssertionError("channel_scores returned scores that are not finite")
    if not torch.equal(method.channel_scores(weight, statistics), scores):
        raise AssertionError("channel_scores gave a different result for the same input")
    after = [t for t in (weight, statistics.sq_norms, statistics.mean, statistics.variance) if t is not None]
    if not all(torch.equal(a, b) for a, b in zip(after, copies)):
        raise AssertionError("channel_scores changed its inputs")
    for kind, width in (("mlp", 1), ("heads", 4)):
        units = method.unit_scores(scores.reshape(-1, width), kind)
        if not isinstance(units, torch.Tensor) or tuple(units.shape) != (_IN // width,):
            raise AssertionError(
                f"unit_scores must return one score per unit ({_IN // width},), got {_describe(units)}"
            )
        if not bool(torch.isfinite(units).all()):
            raise AssertionError(f"unit_scores returned scores that are not finite for {kind}")


def _check_blocks(method: ShrinkMethod, device: str) -> None:
    generator = torch.Generator().manual_seed(_SEED)
    hidden = torch.randn(2, 32, _IN, generator=generator)
    after = hidden + 0.5 * torch.randn(2, 32, _IN, generator=generator)
    observed = Observation(0, hidden.to(device), after.to(device))
    statistics = BlockStatistics(
        n_tokens=64, cosine_sum=51.2, extra=_sampled(method, "blocks", observed, "block_cosine")
    )
    score = method.block_score(statistics)
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise AssertionError(f"block_score must return a finite float, got {score!r}")
    if method.block_score(statistics) != score:
        raise AssertionError("block_score gave a different result for the same statistics")


def _check_experts(method: ShrinkMethod, device: str) -> None:
    generator = torch.Generator().manual_seed(_SEED)
    routed = torch.randint(0, 20, (_EXPERTS,), generator=generator).float()
    routed[0] = 0  # an expert no token reached
    gate_sum = routed * torch.rand(_EXPERTS, generator=generator)
    norm_sum = routed * torch.rand(_EXPERTS, generator=generator) * 3
    extra = _sampled(method, "experts", _experts_call(generator, device), "expert_routing")
    statistics = ExpertStatistics(routed, gate_sum, norm_sum, gate_sum * norm_sum / routed.clamp(min=1), extra)
    scores = method.expert_scores(statistics)
    if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != (_EXPERTS,):
        raise AssertionError(f"expert_scores must return a tensor of shape ({_EXPERTS},), got {_describe(scores)}")
    if not bool(torch.isfinite(scores).all()):
        raise AssertionError("expert_scores returned scores that are not finite (an expert no token reached?)")
    if not torch.equal(method.expert_scores(statistics), scores):
        raise AssertionError("expert_scores gave a different result for the same statistics")


def _describe(value: object) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__


def _sampled(method: ShrinkMethod, target: str, observation: Observation, built_in: str) -> dict[str, Any]:
    """The statistics ``method`` needs for ``target`` that a plugin registered, gathered over ``observation``."""
    return sampled(method.needs(target), SITE_OF[target], observation, leave_out={built_in})


class _Experts(nn.Module):
    """A mixture's experts as transformers calls them: ``experts(hidden_states, top_k_index, top_k_weights)``."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(_EXPERTS, _IN, _IN, generator=generator) / _IN**0.5)

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        output = torch.zeros_like(hidden)
        for slot in range(top_k_index.shape[1]):
            chosen = self.weight[top_k_index[:, slot]]
            output += top_k_weights[:, slot, None] * torch.einsum("ti,tio->to", hidden, chosen)
        return output


def _experts_call(generator: torch.Generator, device: str) -> Observation:
    """One call of a random experts module on 40 tokens, each routed to 2 of its experts, as an observation."""
    experts = _Experts(generator).to(device)
    hidden = torch.randn(40, _IN, generator=generator).to(device)
    scores = torch.randn(40, _EXPERTS, generator=generator).softmax(-1).to(device)
    weights, index = scores.topk(2, dim=-1)
    with torch.no_grad():
        output = experts(hidden, index, weights)
    return Observation(0, hidden, output, module=experts, args=(hidden, index, weights), units=_EXPERTS)
