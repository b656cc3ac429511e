"""The calibration statistics of shrink methods, gathered in one forward of a block over the calibration set.

The runtime's recorder (:mod:`prunereg._runtime.recorder`) observes the block
where each statistic the method needs is observed: the input of each output
projection (``channel_moments``, and any ``layer_input`` statistic), the
block's input and output hidden states (``block_cosine``, any ``block`` one)
and the calls of a mixture's ``experts`` module (``expert_routing``, any
``module_call`` one). What it gathered becomes the :class:`ChannelStatistics`,
:class:`BlockStatistics` and :class:`ExpertStatistics` a method reads. A pass
whose outputs feed nothing stops each forward, from the second batch on, once
the last observed projection has read its input (the products after it are
not needed).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._runtime.capture import BlockInputs
from prunereg._runtime.ranks import Ranks
from prunereg._runtime.recorder import Called, Recorder, Tally, gather
from prunereg._runtime.registry import at_site
from prunereg._runtime.standard import Moments, Routing
from prunereg._shrink.contract import SITE_OF, BlockStatistics, ChannelStatistics, ExpertStatistics


@dataclass
class BlockObservation:
    """What one calibration pass over a block saw: the outputs (if kept), and the statistics asked for."""

    outputs: list[Tensor] = field(default_factory=list)
    channels: dict[str, ChannelStatistics] = field(default_factory=dict)
    block: BlockStatistics = field(default_factory=lambda: BlockStatistics(0, 0.0))
    experts: ExpertStatistics | None = None
    seconds: float = 0.0


def observe_block(
    block: nn.Module,
    inputs: BlockInputs,
    writers: Mapping[str, nn.Module],
    experts: Called | None,
    needs: Collection[str],
    *,
    keep_outputs: bool,
    ranks: Ranks | None = None,
) -> BlockObservation:
    """Run every calibration batch through ``block`` and gather the statistics ``needs`` names.

    ``writers`` are the output projections by unit kind (``mlp``, ``heads``),
    observed at their input; ``experts`` the experts module whose calls are
    observed (None for none). ``keep_outputs``: keep the block's outputs, the
    next block's inputs when this block is not changed (else each batch's
    output lives only while its statistics are taken, and memory stays one set
    of activations). With ``ranks``, ``inputs`` are this rank's share and the
    statistics are every rank's, combined.
    """
    by_site = {target: at_site(needs, site) for target, site in SITE_OF.items()}
    recorder = Recorder(
        by_site["channels"],
        layers=writers,
        call_statistics=by_site["experts"],
        calls={"experts": experts} if experts is not None else None,
        block_statistics=by_site["blocks"],
        stop_early=not keep_outputs,
    )
    observation = BlockObservation(gather(block, inputs, recorder, keep_outputs=keep_outputs))
    if ranks is not None:
        ranks.merge(recorder)
    for kinds, n_tokens, results in recorder.group_results():
        for kind in kinds:
            observation.channels[kind] = channel_statistics(n_tokens, results)
    observation.block = block_statistics(recorder.block)
    if experts is not None and recorder.called:
        observation.experts = expert_statistics(recorder.called["experts"], experts.units or 0)
    observation.seconds = recorder.seconds
    return observation


def channel_statistics(n_tokens: int, results: Mapping[str, Any]) -> ChannelStatistics:
    """The statistics gathered at one output projection's input, as a method reads them."""
    extra = {name: value for name, value in results.items() if name != "channel_moments"}
    moments = results.get("channel_moments")
    if not isinstance(moments, Moments):
        return ChannelStatistics(n_tokens if extra else 0, extra=extra)
    return ChannelStatistics(moments.n_tokens, moments.sq_norms, moments.mean, moments.variance, extra)


def block_statistics(tally: Tally) -> BlockStatistics:
    """The statistics gathered from a block's hidden states, as a method reads them."""
    results = tally.results()
    cosine_sum = results.pop("block_cosine", 0.0)
    return BlockStatistics(tally.n_tokens, float(cosine_sum), results)


def expert_statistics(tally: Tally, n_experts: int) -> ExpertStatistics:
    """The statistics gathered from the calls of an experts module, as a method reads them (zeros if never called)."""
    results = tally.results()
    routing = results.pop("expert_routing", None)
    if not isinstance(routing, Routing):
        zeros = torch.zeros(n_experts, dtype=torch.float32)
        routing = Routing(zeros, zeros, zeros, zeros)
    return ExpertStatistics(
        routing.routed, routing.gate_sum, routing.output_norm_sum, routing.weighted_norm_sum, results
    )
