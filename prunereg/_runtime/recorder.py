"""The one recorder of calibration statistics: forward hooks that fold each batch into the statistics asked for.

One :class:`Recorder` serves every engine: one-shot pruning (the inputs of a
block's layers), shrinking (the inputs of the writer projections, the block's
hidden states, the experts' routing), gradual pruning (the inputs of layers
anywhere in a whole model) and any statistic a plugin registers. Each site is
a :class:`Tally`, the statistics gathered there and the tokens they saw.

- ``layer_input``: layers that read the same input tensor (q/k/v of an
  attention, gate/up of a gated MLP) form one *input group*: their statistics
  are the same, so they are gathered once. Groups are found on the first
  calibration batch by tensor identity (which layer received which tensor
  object); after it, only one hook per group stays, where every layer was
  called once (a layer called twice keeps every hook, and each batch is
  grouped anew). A layer the first batch did not reach (an expert no token
  chose yet) keeps its hook, and gets a group of its own when a batch does.
- ``module_call``: a forward hook keeps each call of the module; it is folded
  in once the batch's forward is over, with the block's hidden states.
- ``block``: folded in with the block's input and output hidden states.

A pass whose outputs feed nothing and that gathers layer inputs only stops each
forward from the second batch on, once every group's input is folded in (and
every layer observed has been reached once)
(:class:`~prunereg._runtime.capture.RestNotNeeded`): the products after it (the
MLP's down projection, usually) are not needed. Every fold runs with torch's
float32 matmul at full precision, whatever the forwards around it use.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from torch import Tensor, nn

from prunereg._runtime.capture import BlockInputs, RestNotNeeded, call_block
from prunereg._runtime.pairwise import PairwiseTree, Span
from prunereg._runtime.precision import matmul_precision
from prunereg._runtime.statistics import Observation, Statistic

#: What makes a statistic for one site: its class, or any callable returning an empty one.
Factory = Callable[[], Statistic]


class Partial:
    """The statistics at one site over some calibration batches, and the tokens they saw."""

    def __init__(self, factories: Mapping[str, Factory]) -> None:
        self.n_tokens = 0
        self.statistics = {name: make() for name, make in factories.items()}

    def fold(self, observation: Observation) -> None:
        self.n_tokens += observation.n_tokens()
        for statistic in self.statistics.values():
            statistic.fold(observation)

    def combine(self, other: Partial) -> None:
        """Take in ``other`` (the same statistics over later batches), statistic by statistic in name order."""
        self.n_tokens += other.n_tokens
        for name in sorted(self.statistics):
            self.statistics[name].combine(other.statistics[name])

    def results(self) -> dict[str, Any]:
        """Each statistic's result by name."""
        return {name: statistic.result() for name, statistic in self.statistics.items()}

    def state(self) -> dict[str, Any]:
        """These statistics as tensors and numbers only (each one :class:`Stateful`): what ranks can exchange."""
        states = {}
        for name, statistic in self.statistics.items():
            if not isinstance(statistic, Stateful):
                raise TypeError(f"{type(statistic).__name__} has no state() to exchange between ranks")
            states[name] = statistic.state()
        return {"n_tokens": self.n_tokens, "statistics": states}

    @classmethod
    def from_state(cls, factories: Mapping[str, Factory], state: Mapping[str, Any]) -> Partial:
        """The partial result :meth:`state` described, its statistics made by ``factories``."""
        partial = cls(factories)
        partial.n_tokens = int(state["n_tokens"])
        for name, statistic in partial.statistics.items():
            cast(Stateful, statistic).load_state(state["statistics"][name])
        return partial


@runtime_checkable
class Stateful(Protocol):
    """A statistic whose partial result is tensors and numbers only, so ranks exchange it without pickling code."""

    def state(self) -> Mapping[str, Any]: ...

    def load_state(self, state: Mapping[str, Any]) -> None: ...


class Tally:
    """The statistics gathered at one site, and the tokens they saw.

    Each batch is folded into statistics of its own, and the batches' partial
    results are combined along one fixed binary tree over the batch indices
    (:mod:`prunereg._runtime.pairwise`): so the results are the same bits
    whether one process saw every batch or ranks saw contiguous ranges of them
    and their tallies were combined in rank order (:meth:`combine`).
    Observations of one batch (a layer called twice, several module calls)
    share its partial; batches must come in increasing order.
    """

    def __init__(self, factories: Mapping[str, Factory]) -> None:
        self.factories = dict(factories)
        self.n_tokens = 0
        self._tree: PairwiseTree[Partial] = PairwiseTree()
        self._batch = 0
        self._current: Partial | None = None

    def fold(self, observation: Observation) -> None:
        if self._current is None or observation.batch != self._batch:
            self._close_batch()
            self._current, self._batch = Partial(self.factories), observation.batch
        self.n_tokens += observation.n_tokens()
        self._current.fold(observation)

    def spans(self) -> list[Span[Partial]]:
        """The partial results so far, as spans of batches in batch order (what a rank hands the others)."""
        self._close_batch()
        return self._tree.spans

    def combine(self, other: Tally) -> None:
        """Take in ``other`` (the same statistics over the batches after this one's: another rank's), span by span."""
        self.extend(other.n_tokens, other.spans())

    def extend(self, n_tokens: int, spans: list[Span[Partial]]) -> None:
        """Take in the ``spans`` (over ``n_tokens`` tokens) of later batches, as :meth:`spans` gave them."""
        self._close_batch()
        self.n_tokens += n_tokens
        for span in spans:
            self._tree.push(span)

    def results(self) -> dict[str, Any]:
        """Each statistic's result by name, over every batch folded or combined in."""
        self._close_batch()
        total = self._tree.total()
        return (total if total is not None else Partial(self.factories)).results()

    def _close_batch(self) -> None:
        if self._current is not None:
            self._tree.add(self._batch, self._current)
            self._current = None


@dataclass
class Called:
    """A module whose calls a ``module_call`` statistic observes, and how many units (experts) it dispatches to."""

    module: nn.Module
    units: int | None = None


@dataclass
class Batch:
    """One batch's forward under :meth:`Recorder.batch`: set ``outputs`` to the block's output once it is there."""

    index: int
    inputs: Tensor | None = None
    outputs: Tensor | None = None


class Recorder:
    """Forward hooks that gather statistics over calibration forwards (a block's, or a whole model's).

    ``layers`` (name -> layer) are observed at their input with the
    ``layer_statistics`` factories (name -> statistic class or factory),
    ``calls`` (name -> :class:`Called`) with the ``call_statistics`` and the
    block's hidden states with the ``block_statistics``. Use as a context
    manager around the forwards, each batch inside :meth:`batch` (or run a
    block over its inputs with :func:`gather`). :attr:`groups` lists the input
    groups (layer names in first-call order) and :attr:`seconds` the time
    spent folding. ``stop_early=False`` keeps every forward whole (its outputs
    are wanted).
    """

    def __init__(
        self,
        layer_statistics: Mapping[str, Factory] | None = None,
        *,
        layers: Mapping[str, nn.Module] | None = None,
        call_statistics: Mapping[str, Factory] | None = None,
        calls: Mapping[str, Called] | None = None,
        block_statistics: Mapping[str, Factory] | None = None,
        stop_early: bool = True,
    ) -> None:
        self.layers = dict(layers or {})
        self.layer_statistics = dict(layer_statistics or {})
        self.calls = dict(calls or {}) if call_statistics else {}
        self.call_statistics = dict(call_statistics or {})
        self.block_statistics = dict(block_statistics or {})
        self.groups: list[list[str]] = []
        self.tallies: list[Tally] = []
        self.called = {name: Tally(self.call_statistics) for name in self.calls}
        self.block = Tally(self.block_statistics)
        self.seconds = 0.0
        self._stop_early = stop_early and not self.calls and not self.block_statistics
        self._first_batch = True
        self._regular = True  # every layer called at most once per forward: one hook per group suffices
        self._group_of: dict[str, int] = {}
        self._seen: list[tuple[Tensor, int]] = []  # this batch's group inputs, kept alive so identity is sound
        self._call_counts: dict[str, int] = {}
        self._pending: list[tuple[str, nn.Module, tuple[Any, ...], dict[str, Any], Any]] = []
        self._layer_handles: dict[str, Any] = {}
        self._call_handles: list[Any] = []
        self._folding = False
        self._batch = 0
        self._groups_this_batch = 0

    # -- the hooks -----------------------------------------------------------------------

    def __enter__(self) -> Recorder:
        if self.layer_statistics:
            for name, layer in self.layers.items():
                self._layer_handles[name] = layer.register_forward_pre_hook(self._layer_hook(name))
        for name, called in self.calls.items():
            self._call_handles.append(called.module.register_forward_hook(self._call_hook(name), with_kwargs=True))
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in [*self._layer_handles.values(), *self._call_handles]:
            handle.remove()
        self._layer_handles.clear()
        self._call_handles.clear()
        self._seen.clear()
        self._pending.clear()

    @contextlib.contextmanager
    def batch(self, index: int = 0, inputs: Tensor | None = None) -> Iterator[Batch]:
        """Around one batch's forward; ``inputs`` are the block's input hidden states, if a block runs.

        A forward the hooks stop (:class:`~prunereg._runtime.capture.RestNotNeeded`)
        ends here. After it, the module calls and (given the block's ``outputs``)
        the block's hidden states are folded in.
        """
        batch = Batch(index, inputs)
        self._batch = index
        self._groups_this_batch = 0
        self._seen.clear()
        with contextlib.suppress(RestNotNeeded):
            yield batch
        self._fold_calls(batch)
        if self.block_statistics and batch.inputs is not None and batch.outputs is not None:
            self._folded(self.block, Observation(index, batch.inputs, batch.outputs))
        self._batch_done()

    def _layer_hook(self, name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def record(module: nn.Module, args: tuple[Any, ...]) -> None:
            if self._folding:  # a statistic's own calls of the layers
                return
            x = args[0]
            index = self._group_for(name, x)
            if index is not None:
                self._folded(self.tallies[index], Observation(self._batch, x))
                self._groups_this_batch += 1
            if self._stop_early and not self._first_batch and self._regular and self._every_group_seen():
                raise RestNotNeeded

        return record

    def _every_group_seen(self) -> bool:
        """Whether this batch has folded in every group, and no hooked layer is still to be reached for a first time.

        (Layers called in an order that depends on the data, a mixture's experts, may come in any order.)
        """
        return self._groups_this_batch == len(self.groups) and len(self._group_of) == len(self.layers)

    def _call_hook(self, name: str) -> Callable[..., None]:
        def keep(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if not self._folding:  # not a statistic's own call of the module
                self._pending.append((name, module, args, dict(kwargs), output))

        return keep

    # -- folding -------------------------------------------------------------------------

    def _folded(self, tally: Tally, observation: Observation) -> None:
        start = time.perf_counter()
        self._folding = True
        try:
            with matmul_precision("highest"):
                tally.fold(observation)
        finally:
            self._folding = False
            self.seconds += time.perf_counter() - start

    def _fold_calls(self, batch: Batch) -> None:
        pending, self._pending = self._pending, []
        for name, module, args, kwargs, output in pending:
            first = args[0] if args else next((v for v in kwargs.values() if isinstance(v, Tensor)), None)
            observation = Observation(
                batch.index,
                first if isinstance(first, Tensor) else None,
                output if isinstance(output, Tensor) else None,
                module=module,
                args=args,
                kwargs=kwargs,
                units=self.calls[name].units,
                block_inputs=batch.inputs,
                block_outputs=batch.outputs,
            )
            self._folded(self.called[name], observation)

    def _group_for(self, name: str, x: Tensor) -> int | None:
        """The index of the group whose statistics ``x`` updates, or None where this batch counted it already.

        In a regular run after the first batch only the groups' first layers
        are hooked, each reading its group's input; a layer first reached
        after the first batch gets a group of its own then.
        """
        if not self._first_batch and self._regular and name in self._group_of:
            return self._group_of[name]
        if self._first_batch:
            self._call_counts[name] = self._call_counts.get(name, 0) + 1
        for seen, index in self._seen:
            if seen is x:
                if name not in self._group_of:
                    self._group_of[name] = index
                    self.groups[index].append(name)
                return None
        if name not in self._group_of:
            self._group_of[name] = len(self.groups)
            self.groups.append([name])
            self.tallies.append(Tally(self.layer_statistics))
        self._seen.append((x, self._group_of[name]))
        return self._group_of[name]

    def _batch_done(self) -> None:
        """After the first batch: where every layer was called once, keep only one hook per group."""
        self._seen.clear()
        if not self._first_batch:
            return
        self._first_batch = False
        self._regular = all(count <= 1 for count in self._call_counts.values())
        if not self._regular:
            return
        leaders = {group[0] for group in self.groups}
        # a layer the first batch did not reach (an expert no token chose yet) keeps its hook: a later batch may
        for name in [name for name in self._layer_handles if name in self._group_of and name not in leaders]:
            self._layer_handles.pop(name).remove()

    # -- results -------------------------------------------------------------------------

    def group_results(self) -> list[tuple[list[str], int, dict[str, Any]]]:
        """Each input group: its layer names, token count and statistics by name (an uncalled layer is in none)."""
        return [
            (group, tally.n_tokens, tally.results()) for group, tally in zip(self.groups, self.tallies, strict=True)
        ]


def gather(block: nn.Module, inputs: BlockInputs, recorder: Recorder, *, keep_outputs: bool = False) -> list[Tensor]:
    """Run every calibration batch of ``inputs`` through ``block`` under ``recorder``; the outputs if kept."""
    outputs: list[Tensor] = []
    with recorder:
        for index in range(len(inputs)):
            with recorder.batch(inputs.first + index, inputs.hidden[index]) as batch:
                batch.outputs = call_block(block, inputs, index)
            if keep_outputs and batch.outputs is not None:
                outputs.append(batch.outputs)
    return outputs
