"""The built-in statistics: what Wanda, SparseGPT, OWL, FLAP, Wanda-sp, ShortGPT and REAP read.

- ``input_sq_norms`` (:class:`InputSqNorms`): per input feature, the sum over tokens of ``x_j ** 2``;
- ``hessian`` (:class:`Hessian`): SparseGPT's ``(2 / n) * sum of x x^T``, kept as a running mean;
- ``channel_moments`` (:class:`ChannelMoments`): per input channel, the token count, the sum
  of squares, the mean and the variance, merged batch by batch as Chan et al. merge
  them, so that the variance keeps float32 precision over many tokens;
- ``block_cosine`` (:class:`BlockCosine`): the sum over tokens of cos(input, output) of a block;
- ``expert_routing`` (:class:`ExpertRouting`): per expert of a mixture, the tokens routed
  to it, their routing weights, and the norms of its outputs on them (each expert is
  run once more on its tokens, with routing weight 1: REAP's saliency).

Sums run in float32 (the cosine's in float64) with batched matrix products over
every token of a batch at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._runtime.gram import add_upper_gram, mirror_upper_gram
from prunereg._runtime.precision import matmul_precision
from prunereg._runtime.statistics import Observation, Statistic, same_kind


class InputSqNorms(Statistic):
    """Per input feature: the sum over tokens of ``x_j ** 2`` (float32; Wanda's norms are its square root)."""

    NAME = "input_sq_norms"
    SITE = "layer_input"

    def __init__(self) -> None:
        self.sums: Tensor | None = None

    def fold(self, observation: Observation) -> None:
        sq_norms = observation.rows().square().sum(dim=0)
        self.sums = sq_norms if self.sums is None else self.sums.add_(sq_norms)

    def combine(self, other: Statistic) -> None:
        theirs = same_kind(other, InputSqNorms).sums
        if theirs is not None:
            self.sums = theirs.clone() if self.sums is None else self.sums.add_(theirs)

    def result(self) -> Tensor | None:
        return self.sums


class Hessian(Statistic):
    """SparseGPT's layer Hessian ``(2 / n) * sum over tokens of x x^T``, float32.

    Kept as a running mean, as SparseGPT's reference keeps it, so that its
    scale stays that of one token; summed by upper tiles in full float32
    whatever the forwards around it use. The result is the running tensor itself,
    its lower tiles filled in place.
    """

    NAME = "hessian"
    SITE = "layer_input"

    def __init__(self) -> None:
        self.n_tokens = 0
        self.running: Tensor | None = None

    def fold(self, observation: Observation) -> None:
        tokens = observation.rows()
        if tokens.shape[0] == 0:
            return
        seen = self.n_tokens
        self.n_tokens = seen + tokens.shape[0]
        if self.running is None:
            width = tokens.shape[1]
            self.running = torch.zeros(width, width, dtype=torch.float32, device=tokens.device)
        with matmul_precision("highest"):  # the forwards around this may run with faster products
            add_upper_gram(self.running, tokens, beta=seen / self.n_tokens, alpha=2.0 / self.n_tokens)

    def combine(self, other: Statistic) -> None:
        theirs = same_kind(other, Hessian)
        if theirs.running is None:
            return
        if self.running is None:
            self.n_tokens, self.running = theirs.n_tokens, theirs.running.clone()
            return
        total = self.n_tokens + theirs.n_tokens
        self.running.mul_(self.n_tokens / total).add_(theirs.running, alpha=theirs.n_tokens / total)
        self.n_tokens = total

    def result(self) -> Tensor | None:
        if self.running is not None:
            mirror_upper_gram(self.running)
        return self.running


@dataclass(frozen=True)
class Moments:
    """Per input channel over ``n_tokens`` tokens: the sum of ``x_j ** 2``, the mean and the sample variance."""

    n_tokens: int
    sq_norms: Tensor
    mean: Tensor
    variance: Tensor


class ChannelMoments(Statistic):
    """Per input channel: token count, sum of squares, mean and sum of squared deviations, in float32."""

    NAME = "channel_moments"
    SITE = "layer_input"

    def __init__(self) -> None:
        self.n_tokens = 0
        self.sq_norms: Tensor | None = None
        self.mean: Tensor | None = None
        self.m2: Tensor | None = None

    def fold(self, observation: Observation) -> None:
        tokens = observation.rows()
        if tokens.shape[0] == 0:
            return
        batch_mean = tokens.mean(dim=0)
        batch_m2 = (tokens - batch_mean).square_().sum(dim=0)
        self._merge(tokens.shape[0], batch_mean, batch_m2, tokens.square().sum(dim=0))

    def combine(self, other: Statistic) -> None:
        theirs = same_kind(other, ChannelMoments)
        if theirs.mean is not None and theirs.m2 is not None and theirs.sq_norms is not None:
            self._merge(theirs.n_tokens, theirs.mean.clone(), theirs.m2.clone(), theirs.sq_norms.clone())

    def _merge(self, n: int, mean: Tensor, m2: Tensor, sq_norms: Tensor) -> None:
        """Chan et al.'s merge of the moments of ``n`` more tokens (tensors this statistic may keep)."""
        if self.mean is None or self.m2 is None or self.sq_norms is None:
            self.n_tokens, self.mean, self.m2, self.sq_norms = n, mean, m2, sq_norms
            return
        total = self.n_tokens + n
        delta = mean - self.mean
        self.m2 += m2 + delta.square() * (self.n_tokens * n / total)
        self.mean += delta * (n / total)
        self.sq_norms += sq_norms
        self.n_tokens = total

    def result(self) -> Moments | None:
        if self.mean is None or self.m2 is None or self.sq_norms is None:
            return None
        return Moments(self.n_tokens, self.sq_norms, self.mean, self.m2 / max(self.n_tokens - 1, 1))


class BlockCosine(Statistic):
    """The sum over tokens of cos(block input, block output): ShortGPT's block influence is 1 minus its mean."""

    NAME = "block_cosine"
    SITE = "block"

    def __init__(self) -> None:
        self.n_tokens = 0
        self.cosine_sum = 0.0

    def fold(self, observation: Observation) -> None:
        assert observation.inputs is not None and observation.outputs is not None
        x, y = observation.inputs.float(), observation.outputs.float()
        with matmul_precision("highest"):
            cos = nn.functional.cosine_similarity(x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1]), dim=-1)
        self.n_tokens += cos.numel()
        self.cosine_sum += float(cos.double().sum())

    def combine(self, other: Statistic) -> None:
        theirs = same_kind(other, BlockCosine)
        self.n_tokens += theirs.n_tokens
        self.cosine_sum += theirs.cosine_sum

    def result(self) -> float:
        return self.cosine_sum


@dataclass(frozen=True)
class Routing:
    """Per expert (float32 ``[experts]``): tokens routed, sum of routing weights, of output norms, of their products."""

    routed: Tensor
    gate_sum: Tensor
    output_norm_sum: Tensor
    weighted_norm_sum: Tensor


class ExpertRouting(Statistic):
    """The routing of a mixture's ``experts`` module, called as ``experts(hidden_states, top_k_index, top_k_weights)``.

    Each expert is run once more on the tokens routed to it, with routing
    weight 1, for the norms of its outputs. Sized by the observation's ``units``
    (the number of experts); sums on the CPU in float32.
    """

    NAME = "expert_routing"
    SITE = "module_call"

    def __init__(self) -> None:
        self.sums: list[Tensor] | None = None  # routed, gate_sum, output_norm_sum, weighted_norm_sum

    def fold(self, observation: Observation) -> None:
        experts, n_experts = observation.module, observation.units
        if experts is None or n_experts is None:
            raise ValueError("expert_routing observes an experts module and needs the number of its experts")
        if self.sums is None:
            self.sums = [torch.zeros(n_experts, dtype=torch.float32) for _ in range(4)]
        routed, gate_sum, norm_sum, weighted_sum = self.sums
        hidden, top_k_index, top_k_weights = _expert_arguments(observation.args, observation.kwargs)
        hidden = hidden.reshape(-1, hidden.shape[-1])
        index = top_k_index.reshape(hidden.shape[0], -1)
        weights = top_k_weights.reshape(hidden.shape[0], -1).float()
        for expert in range(n_experts):
            tokens, slot = torch.where(index == expert)
            if tokens.numel() == 0:
                continue
            only = torch.full((tokens.numel(), 1), expert, dtype=index.dtype, device=index.device)
            ones = torch.ones((tokens.numel(), 1), dtype=top_k_weights.dtype, device=top_k_weights.device)
            output = experts(hidden[tokens], only, ones)
            norms = output.float().norm(dim=-1).cpu()
            gates = weights[tokens, slot].cpu()
            routed[expert] += tokens.numel()
            gate_sum[expert] += gates.sum()
            norm_sum[expert] += norms.sum()
            weighted_sum[expert] += (gates * norms).sum()

    def combine(self, other: Statistic) -> None:
        theirs = same_kind(other, ExpertRouting).sums
        if theirs is None:
            return
        if self.sums is None:
            self.sums = [tensor.clone() for tensor in theirs]
            return
        for mine, their in zip(self.sums, theirs, strict=True):
            mine += their

    def result(self) -> Routing | None:
        return None if self.sums is None else Routing(*self.sums)


def _expert_arguments(args: tuple[Any, ...], kwargs: Any) -> tuple[Tensor, Tensor, Tensor]:
    names = ("hidden_states", "top_k_index", "top_k_weights")
    found: list[Any] = list(args) + [kwargs[name] for name in names[len(args) :] if name in kwargs]
    if len(found) < 3 or not all(isinstance(value, Tensor) for value in found[:3]):
        raise TypeError("the experts module is not called as experts(hidden_states, top_k_index, top_k_weights)")
    return found[0], found[1], found[2]


#: The built-in statistics, registered under their names before any other.
BUILT_IN: tuple[type[Statistic], ...] = (InputSqNorms, Hessian, ChannelMoments, BlockCosine, ExpertRouting)
