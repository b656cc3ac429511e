"""The calibration statistics of shrink methods, gathered in one forward of a block over the calibration set.

Forward pre-hooks on the output projections fold each batch's inputs into
running moments (token count, sum of squares, mean and the sum of squared
deviations, merged batch by batch as Chan et al. do, so that the variance keeps
float32 precision over many tokens). The block's own output gives the cosine
with its input per token. A mixture-of-experts layer is observed at its
``experts`` module: each expert is run once more on the tokens routed to it, with
routing weight 1, to measure the norm of its output (REAP's saliency).
A pass whose outputs feed nothing stops each forward, from the second batch on,
once the last observed projection has read its input (the products after it
are not needed).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._runtime.capture import BlockInputs, RestNotNeeded, call_block_for_statistics
from prunereg._runtime.precision import matmul_precision
from prunereg._shrink.contract import BlockStatistics, ChannelStatistics, ExpertStatistics


class RunningMoments:
    """Per input channel: token count, sum of squares, mean and sum of squared deviations, in float32."""

    def __init__(self) -> None:
        self.n_tokens = 0
        self.sq_norms: Tensor | None = None
        self.mean: Tensor | None = None
        self.m2: Tensor | None = None

    def add(self, x: Tensor) -> None:
        """Fold in inputs ``[..., channels]``: every leading index is one token."""
        tokens = x.detach().reshape(-1, x.shape[-1]).float()
        n_batch = tokens.shape[0]
        if n_batch == 0:
            return
        batch_mean = tokens.mean(dim=0)
        batch_m2 = (tokens - batch_mean).square_().sum(dim=0)
        batch_sq = tokens.square().sum(dim=0)
        if self.mean is None or self.m2 is None or self.sq_norms is None:
            self.n_tokens, self.mean, self.m2, self.sq_norms = n_batch, batch_mean, batch_m2, batch_sq
            return
        total = self.n_tokens + n_batch
        delta = batch_mean - self.mean
        self.m2 += batch_m2 + delta.square() * (self.n_tokens * n_batch / total)
        self.mean += delta * (n_batch / total)
        self.sq_norms += batch_sq
        self.n_tokens = total

    def result(self) -> ChannelStatistics:
        if self.m2 is None:
            return ChannelStatistics(0)
        variance = self.m2 / max(self.n_tokens - 1, 1)
        return ChannelStatistics(self.n_tokens, self.sq_norms, self.mean, variance)


class RunningRouting:
    """Per expert: tokens routed, sum of routing weights, of output norms, and of their products."""

    def __init__(self, n_experts: int) -> None:
        self.n_experts = n_experts
        zeros = torch.zeros(n_experts, dtype=torch.float32)
        self.routed, self.gate_sum, self.norm_sum, self.weighted_sum = (zeros.clone() for _ in range(4))

    def add(self, experts: nn.Module, hidden: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> None:
        """Run each expert on its routed tokens (routing weight 1) and fold in its output norms."""
        hidden = hidden.reshape(-1, hidden.shape[-1])
        index = top_k_index.reshape(hidden.shape[0], -1)
        weights = top_k_weights.reshape(hidden.shape[0], -1).float()
        for expert in range(self.n_experts):
            tokens, slot = torch.where(index == expert)
            if tokens.numel() == 0:
                continue
            only = torch.full((tokens.numel(), 1), expert, dtype=index.dtype, device=index.device)
            ones = torch.ones((tokens.numel(), 1), dtype=top_k_weights.dtype, device=top_k_weights.device)
            output = experts(hidden[tokens], only, ones)
            norms = output.float().norm(dim=-1).cpu()
            gates = weights[tokens, slot].cpu()
            self.routed[expert] += tokens.numel()
            self.gate_sum[expert] += gates.sum()
            self.norm_sum[expert] += norms.sum()
            self.weighted_sum[expert] += (gates * norms).sum()

    def result(self) -> ExpertStatistics:
        return ExpertStatistics(self.routed, self.gate_sum, self.norm_sum, self.weighted_sum)


class BlockObservation:
    """What one calibration pass over a block saw: the outputs, and the statistics asked for."""

    def __init__(self) -> None:
        self.outputs: list[Tensor] = []
        self.channels: dict[str, ChannelStatistics] = {}
        self.block = BlockStatistics(0, 0.0)
        self.experts: ExpertStatistics | None = None
        self.seconds = 0.0


def observe_block(
    block: nn.Module,
    inputs: BlockInputs,
    writers: dict[str, nn.Module],
    experts: nn.Module | None,
    n_experts: int,
    *,
    cosine: bool,
    keep_outputs: bool,
) -> BlockObservation:
    """Run every calibration batch through ``block`` and gather the statistics asked for.

    ``writers`` are the projections (by unit kind) whose input moments are wanted;
    ``experts`` the module whose routing is wanted (None for none); ``cosine`` whether
    the block's input/output cosine is. ``keep_outputs``: keep the block's outputs,
    the next block's inputs when this block is not changed (else each batch's
    output lives only while its cosine is taken, and memory stays one set of
    activations).
    """
    observation = BlockObservation()
    moments = {kind: RunningMoments() for kind in writers}
    routing = RunningRouting(n_experts) if experts is not None else None
    stop = _StopAfterLastWriter(len(writers), enabled=not (keep_outputs or cosine or experts is not None))
    handles = [
        writer.register_forward_pre_hook(_moments_hook(kind, moments[kind], observation, stop))
        for kind, writer in writers.items()
    ]
    if experts is not None and routing is not None:
        handles.append(experts.register_forward_pre_hook(_routing_hook(routing, observation), with_kwargs=True))
    n_tokens, cosine_sum = 0, 0.0
    try:
        for batch in range(len(inputs)):
            output = call_block_for_statistics(block, inputs, batch)
            stop.batch_done()
            if output is None:  # stopped after the last writer: this pass keeps no outputs
                continue
            if cosine:
                start = time.perf_counter()
                with matmul_precision("highest"):
                    x, y = inputs.hidden[batch].float(), output.float()
                    cos = nn.functional.cosine_similarity(
                        x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1]), dim=-1
                    )
                n_tokens += cos.numel()
                cosine_sum += float(cos.double().sum())
                observation.seconds += time.perf_counter() - start
            if keep_outputs:
                observation.outputs.append(output)
    finally:
        for handle in handles:
            handle.remove()
    observation.channels = {kind: running.result() for kind, running in moments.items()}
    observation.block = BlockStatistics(n_tokens, cosine_sum)
    observation.experts = routing.result() if routing is not None else None
    return observation


class _StopAfterLastWriter:
    """Learns on the first batch which writer reads its input last; from the second on, its hook ends the forward.

    Only where every writer is called exactly once per forward (a layer called
    twice, or never, keeps every forward whole), and only when ``enabled``: the
    pass keeps no outputs, takes no cosine and watches no routing.
    """

    def __init__(self, n_writers: int, *, enabled: bool) -> None:
        self.n_writers = n_writers
        self.enabled = enabled
        self.calls: list[str] = []
        self.last: str | None = None
        self.first_batch = True

    def called(self, kind: str) -> None:
        """After ``kind``'s writer recorded its input."""
        if self.first_batch:
            self.calls.append(kind)
        elif kind == self.last:
            raise RestNotNeeded

    def batch_done(self) -> None:
        if self.first_batch:
            self.first_batch = False
            if self.enabled and 0 < len(self.calls) == self.n_writers == len(set(self.calls)):
                self.last = self.calls[-1]


def _moments_hook(kind: str, running: RunningMoments, observation: BlockObservation, stop: _StopAfterLastWriter) -> Any:
    def record(module: nn.Module, args: tuple[Any, ...]) -> None:
        start = time.perf_counter()
        with matmul_precision("highest"):
            running.add(args[0])
        observation.seconds += time.perf_counter() - start
        stop.called(kind)

    return record


def _routing_hook(running: RunningRouting, observation: BlockObservation) -> Any:
    busy = False

    def record(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        nonlocal busy
        if busy:  # the hook's own calls of the experts
            return
        busy = True
        start = time.perf_counter()
        try:
            hidden, top_k_index, top_k_weights = _expert_arguments(args, kwargs)
            running.add(module, hidden, top_k_index, top_k_weights)
        finally:
            busy = False
            observation.seconds += time.perf_counter() - start

    return record


def _expert_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor]:
    names = ("hidden_states", "top_k_index", "top_k_weights")
    values: Iterable[Any] = list(args) + [kwargs[name] for name in names[len(args) :] if name in kwargs]
    found = list(values)
    if len(found) < 3 or not all(isinstance(v, Tensor) for v in found[:3]):
        raise TypeError("the experts module is not called as experts(hidden_states, top_k_index, top_k_weights)")
    return found[0], found[1], found[2]
