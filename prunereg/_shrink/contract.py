"""The contract for shrink methods: scores for the parts of a language model that can be removed whole.

A shrink method (FLAP, Wanda-sp, a magnitude baseline, ShortGPT's block
influence, REAP) scores three kinds of *units*, each optional (``TARGETS``):

- ``"channels"``: the input channels of a block's output projections, the MLP's
  down projection (one channel per intermediate neuron) and the attention's output
  projection (``head_dim`` channels per head). :meth:`ShrinkMethod.channel_scores`
  scores each channel from the projection's weight and :class:`ChannelStatistics`
  of its input, and :meth:`ShrinkMethod.unit_scores` turns the channel scores of
  each unit (an MLP channel, a key/value group with its query heads) into the
  unit's score (default: their sum).
- ``"blocks"``: whole decoder blocks, from :class:`BlockStatistics` of the block's
  input and output hidden states (:meth:`ShrinkMethod.block_score`).
- ``"experts"``: the experts of a mixture-of-experts layer, from
  :class:`ExpertStatistics` of the routing (:meth:`ShrinkMethod.expert_scores`).

The engine removes the lowest-scored units. ``STATISTICS`` names what the engine
must gather from the calibration set (registered statistics, see
:mod:`prunereg._runtime.statistics`): those observed at a layer's input are
gathered at the output projections for ``channels``, those of the block's hidden
states for ``blocks``, those of a module's calls at the experts for ``experts``.
A method that asks for none runs without calibration data.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from prunereg._plugins.isolation import guard_plugin_methods
from prunereg._runtime.registry import check_statistics, statistic
from prunereg._runtime.statistics import ReadByName

if TYPE_CHECKING:
    from prunereg._runtime.capture import BlockInputs
    from prunereg._runtime.ranks import Ranks

KIND = "shrink"

#: What a method can score.
TARGET_NAMES = frozenset({"channels", "blocks", "experts"})

#: Where the statistics for each target are observed (the sites of :mod:`prunereg._runtime.statistics`).
SITE_OF = {"channels": "layer_input", "blocks": "block", "experts": "module_call"}


@dataclass(frozen=True)
class ChannelStatistics(ReadByName):
    """What the calibration set says about each input channel of an output projection.

    Over ``n_tokens`` tokens: ``sq_norms[j]`` is the sum of ``x_j ** 2``, ``mean[j]``
    the mean of ``x_j`` and ``variance[j]`` its sample variance (divided by
    ``n_tokens - 1``), all float32 (``channel_moments``). Empty (``n_tokens`` 0,
    tensors None) for a method that asked for no statistics. Any other statistic
    of the projection's input the method asked for is in ``extra``: ``statistics["name"]``.
    """

    n_tokens: int
    sq_norms: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    variance: torch.Tensor | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BlockStatistics(ReadByName):
    """How much one decoder block changes its input: ``cosine_sum`` is the sum over tokens of cos(input, output).

    Any other statistic of the block's hidden states the method asked for is in ``extra``: ``statistics["name"]``.
    """

    n_tokens: int
    cosine_sum: float
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExpertStatistics(ReadByName):
    """The routing of one mixture-of-experts layer over the calibration tokens, per expert (float32 ``[experts]``).

    ``routed[e]`` counts the tokens routed to expert e, ``gate_sum[e]`` sums their
    routing weights, ``output_norm_sum[e]`` the norms of the expert's outputs on
    them and ``weighted_norm_sum[e]`` the routing weight times that norm
    (``expert_routing``). Any other statistic of the experts' calls the method
    asked for is in ``extra``: ``statistics["name"]``.
    """

    routed: torch.Tensor
    gate_sum: torch.Tensor
    output_norm_sum: torch.Tensor
    weighted_norm_sum: torch.Tensor
    extra: Mapping[str, Any] = field(default_factory=dict)


class ShrinkMethod:
    """A method that scores channels, decoder blocks or experts, the lowest of which ``prunereg.shrink`` removes.

    Subclasses set ``TARGETS`` (which units they score), ``STATISTICS`` (what the
    engine gathers for them: registered statistics by name) and implement the
    matching ``*_scores`` method. A
    method with ``compensates_bias`` true asks the engine to add the mean
    contribution of each removed channel to its projection's bias (FLAP): the
    engine then gathers ``channel_moments`` as well.
    """

    PRUNING_TYPE: ClassVar[str] = KIND
    TARGETS: ClassVar[frozenset[str]] = frozenset()
    STATISTICS: ClassVar[frozenset[str]] = frozenset()
    #: Whether the channel scores, standardized per block, may be ranked across blocks (``allocation="global"``).
    ALLOCATES_ACROSS_BLOCKS: ClassVar[bool] = False
    #: Whether every block is observed on the dense model's activations (FLAP's code: one forward per block) rather
    #: than on what the blocks already cut before it give (Wanda's: a second forward of each cut block).
    OBSERVES_DENSE_MODEL: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        unknown = set(cls.TARGETS) - TARGET_NAMES
        if unknown:
            raise TypeError(f"{cls.__name__}.TARGETS names unknown entries: {', '.join(sorted(unknown))}")
        check_statistics(cls.__name__, cls.STATISTICS)
        # A third-party method runs as plugin code: sys.exit() in it is an error, its prints go to stderr.
        guard_plugin_methods(cls, ("__init__", "channel_scores", "unit_scores", "block_score", "expert_scores"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @property
    def compensates_bias(self) -> bool:
        """Whether the engine adds removed channels' mean contribution to the output projection's bias (FLAP)."""
        return False

    def channel_scores(self, weight: torch.Tensor, statistics: ChannelStatistics) -> torch.Tensor:
        """One score per input channel of an output projection (``weight``: float32 ``[out, in]``), ``[in]``.

        Higher means more important; the lowest go. The weight is left untouched.
        """
        raise NotImplementedError(f"{type(self).__name__} does not score channels")

    def unit_scores(self, channel_scores: torch.Tensor, kind: str) -> torch.Tensor:
        """One score per unit from the scores of its channels, ``[units, channels per unit]`` -> ``[units]``.

        ``kind`` is ``"mlp"`` (one channel per unit) or ``"heads"`` (a key/value
        group: its query heads' ``head_dim`` channels each). Default: the sum.
        """
        return channel_scores.sum(dim=1)

    def block_score(self, statistics: BlockStatistics) -> float:
        """How important one decoder block is; the blocks with the lowest scores are removed."""
        raise NotImplementedError(f"{type(self).__name__} does not score decoder blocks")

    def expert_scores(self, statistics: ExpertStatistics) -> torch.Tensor:
        """One score per expert of a mixture-of-experts layer (``[experts]``); the lowest are removed."""
        raise NotImplementedError(f"{type(self).__name__} does not score experts")

    def needs(self, target: str) -> frozenset[str]:
        """The statistics this method needs to score ``target`` units (those of ``STATISTICS`` observed there)."""
        needed = {name for name in self.STATISTICS if SITE_OF[target] == statistic(name).SITE}
        if target == "channels" and self.compensates_bias:
            needed.add("channel_moments")
        return frozenset(needed)


class BlockFollower:
    """What runs on each block right after its cut, in shrinking's own pass: recovery (``shrink(recover=...)``).

    Shrinking runs each block on the calibration set before its cut; those
    outputs are the dense block's (on the dense model's trajectory when the
    method observes the dense model, else on the shrunk one's). The engine
    calls :meth:`start` with the first block's inputs, :meth:`watching` around
    each block's pass before its cut (to watch inside it), then :meth:`follow`
    with the cut block, the inputs along the shrunk model's trajectory and the
    dense outputs (and, for a follower whose :attr:`reads_dense_inputs` is true,
    the inputs those outputs came from where they are not the shrunk
    trajectory's): it returns the cut block's outputs, which feed the next
    block. :meth:`finish` runs after the last block. The engine puts back what a
    follower changed in the blocks and the config when the run fails.

    Streamed from a folder (``shrink_folder``), each block's weights are written
    and given back (to the meta device) right after :meth:`follow`: a follower
    notes there what :meth:`finish` needs, and a parameter :meth:`finish` sets
    to None (a bias taken back) is deleted from the written shards.
    """

    @property
    def reads_dense_inputs(self) -> bool:
        """Whether :meth:`follow` wants the dense block's inputs (kept alive through it: one more set of them)."""
        return False

    def over_ranks(self, ranks: Ranks, n_batches: int) -> None:
        """Under torch.distributed, before the pass: work on this rank's share of the ``n_batches`` and combine
        with the other ranks, or refuse in one line (a ``ValueError``) where the result would not be one process's."""
        raise ValueError(f"{type(self).__name__} cannot split the calibration over ranks; pass data_parallel=False")

    def start(self, model: torch.nn.Module, blocks: torch.nn.ModuleList, journal: object) -> None:
        """Before the first block: ``journal`` keeps what is replaced, to put back on a failure."""

    def watching(self, index: int, block: torch.nn.Module) -> AbstractContextManager[None]:
        """A context around block ``index``'s pass before its cut (hooks that watch inside it)."""
        return nullcontext()

    def follow(
        self,
        index: int,
        block: torch.nn.Module,
        inputs: BlockInputs,
        dense: list[torch.Tensor],
        dense_inputs: list[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """Work on cut block ``index`` given its ``inputs`` and the dense block's outputs: its outputs per batch.

        ``dense_inputs``: the hidden states the dense outputs came from, where the
        follower :attr:`reads_dense_inputs` and they are not ``inputs`` (None: ``inputs``').
        """
        raise NotImplementedError

    def finish(self, model: torch.nn.Module) -> None:
        """After the last block, before the config is rewritten."""
