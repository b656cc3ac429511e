"""``prunereg.shrink``: remove MLP channels, attention heads, decoder blocks and experts, the config rewritten to match.

The calibration loop is the runtime's (:mod:`prunereg._runtime.capture`), as one-shot pruning's:
the calibration set is run up to the first block once, then each block in turn
is observed (the statistics its method asks for), shrunk, and run again to feed
the next block, so memory is the weights plus one block's activations. Blocks
are scored in the same pass and the lowest removed at the end (ShortGPT scores
every block from one pass over the model). Every block loses the same number of
units, so the rewritten config states the new shape and stock ``transformers``
reloads the saved model; ``allocation="global"`` (FLAP's adaptive structure)
observes every block first, ranks standardized scores across blocks and records
the differing widths as slimming does, for ``prunereg.from_pretrained``.

Every argument is checked before anything changes: a refusal leaves the model
as it was (meta-device weights, and a module or tensor to cut that two places
share, are refused too). Every cut block runs at least one calibration batch
before the next block is touched (a method that re-runs its blocks already
does; one that observes the dense model, or needs no calibration, runs one
batch more), so a block that breaks once cut is an error, never a model handed
back. A failure midway (that forward, the method raising, Ctrl-C) puts every
replaced tensor, attribute and config value back before the error propagates.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._models import slimmed
from prunereg._progress import progress as progress_bar
from prunereg._runtime.blocks import find_blocks
from prunereg._runtime.calibration import check_fits_model
from prunereg._runtime.capture import BlockInputs, advance, batches_of, capture_first_block_inputs
from prunereg._runtime.journal import Journal
from prunereg._runtime.mode import calibration_mode, check_not_reparametrized, input_device
from prunereg._runtime.parts import Experts, UnitGroup, add_zero_biases, find_experts, find_heads, find_mlp
from prunereg._runtime.precision import matmul_precision
from prunereg._runtime.ranks import Ranks, fingerprint, own_batches, together
from prunereg._runtime.recorder import Called
from prunereg._runtime.sharded import refuse_sharded
from prunereg._runtime.weights import BlockWeights, InMemory
from prunereg._selection.select import removal_order
from prunereg._shrink.checks import failures_named, refuse_meta, refuse_sharing
from prunereg._shrink.contract import (
    BlockFollower,
    BlockStatistics,
    ChannelStatistics,
    ExpertStatistics,
    ShrinkMethod,
)
from prunereg._shrink.gather import BlockObservation, observe_block
from prunereg._shrink.options import ShrinkOptions
from prunereg._shrink.removal import compensate_bias, remove_blocks, remove_experts, remove_units
from prunereg._shrink.report import BlockShrink, ShrinkReport

#: Each argument of :func:`shrink` and the kind of unit its method must score.
TARGET_OF = {"mlp": "channels", "heads": "channels", "layers": "blocks", "experts": "experts"}
_NONE = ChannelStatistics(0)


def shrink_model(
    model: nn.Module,
    method: str | ShrinkMethod,
    calibration: Tensor | Iterable[Tensor] | None,
    settings: ShrinkOptions,
    method_options: dict[str, Any],
    follower: BlockFollower | None = None,
) -> ShrinkReport:
    """One shrink run of :func:`prunereg.shrink` (calibration already as token ids), ``follower`` after each cut.

    Under torch.distributed (and ``data_parallel``) the ranks split the
    calibration batches and combine their statistics; a ``follower``
    (recovery) combines its own (:meth:`BlockFollower.over_ranks`).
    """
    ranks = Ranks.current(settings.data_parallel)
    with together(ranks):
        if isinstance(model, nn.Module):  # (streaming fills a model built on the meta device itself)
            refuse_meta(model)
        job = ShrinkJob.prepare(model, method, calibration, settings, method_options, follower, ranks=ranks)
        return job.run(settings.progress, restore_on_error=settings.restore_on_error)


@dataclass
class BlockPlan:
    """What to remove from one block: its unit groups with the number of units each keeps."""

    groups: dict[str, UnitGroup] = field(default_factory=dict)
    keep: dict[str, int] = field(default_factory=dict)
    experts: Experts | None = None
    keep_experts: int = 0

    def cut(self) -> list[str]:
        """The kinds of unit this block loses (``mlp``, ``heads``, ``experts``); asked before the cut."""
        kinds = [kind for kind, group in self.groups.items() if self.keep[kind] < group.n_units]
        if self.experts is not None and 0 < self.keep_experts < self.experts.n_experts:
            kinds.append("experts")
        return kinds


@dataclass
class ShrinkJob:
    """A checked shrink request: the method, the blocks and what each loses, the calibration batches."""

    model: nn.Module
    method: ShrinkMethod
    method_name: str
    blocks_path: str
    blocks: nn.ModuleList
    plans: list[BlockPlan]
    layers: int
    needs: frozenset[str]
    batches: list[Tensor]
    matmul_precision: str
    width: dict[str, Any]
    allocation: str = "uniform"
    check_batch: Tensor | None = None
    """Token ids that check the cuts of a method that needs no calibration (the first batch, or a made-up one)."""
    follower: BlockFollower | None = None
    """What runs on each block right after its cut (recovery), on the calibration batches."""
    ranks: Ranks | None = None
    """The ranks that split the calibration batches and combine their statistics (None: this process alone)."""

    @classmethod
    def prepare(
        cls,
        model: nn.Module,
        method: str | ShrinkMethod,
        calibration: Tensor | Iterable[Tensor] | None,
        options: ShrinkOptions,
        method_options: dict[str, Any],
        follower: BlockFollower | None = None,
        *,
        ranks: Ranks | None = None,
    ) -> ShrinkJob:
        """Check every argument and build the method; nothing in ``model`` changes.

        A ``follower`` (recovery) needs calibration data, the same width in every
        block and no blocks removed (the blocks after a removed one are only known
        at the end of the pass). With ``ranks``, every rank's request is then
        checked against the others' (one collective): ranks that disagree are
        refused on every rank.
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        refuse_sharded(
            model,
            "prunereg.shrink cannot change the shapes of a sharded model's parameters (DTensor, FSDP2): shrink "
            "before fully_shard, or run prunereg shrink --stream on the model saved to a folder",
        )
        config = getattr(model, "config", None)
        if config is None:
            raise ValueError(f"shrink rewrites a Hugging Face config, and {type(model).__name__} has none")
        shares = {name: getattr(options, name) for name in ("mlp", "heads", "experts")}
        layers = options.layers
        wanted = options.wanted()
        if not wanted:
            raise ValueError("nothing to remove: give mlp, heads or experts (a share) or layers (a count)")
        instance, name = _build_method(method, method_options)
        across = options.allocation == "global"
        if across:
            _check_global(instance, name, wanted)
        for what in wanted:
            if TARGET_OF[what] not in instance.TARGETS:
                scores = ", ".join(sorted(instance.TARGETS)) or "nothing"
                raise ValueError(f"{what}=... needs a method that scores {TARGET_OF[what]}; {name} scores {scores}")
        blocks_path, block_list = find_blocks(model, options.blocks)
        check_not_reparametrized(model)
        if layers >= len(block_list):
            raise ValueError(f"layers={layers} would leave none of the {len(block_list)} blocks of {blocks_path}")
        plans = [_plan_block(f"{blocks_path}.{i}", b, config, shares, instance, name) for i, b in enumerate(block_list)]
        if shares["experts"] and not any(plan.experts for plan in plans):
            raise ValueError(f"experts=... needs a mixture-of-experts model; {blocks_path} holds none")
        _check_config(config, plans, layers, same_width=not across)
        _refuse_sharing(model, block_list, plans, layers, with_biases=instance.compensates_bias)
        needs = frozenset().union(*(instance.needs(TARGET_OF[what]) for what in wanted))
        if follower is not None:
            _check_followable(options, calibration)
        batches: list[Tensor] = []
        check_batch = None
        if needs or follower is not None:
            if calibration is None:
                raise ValueError(f"{name} needs calibration data (token ids) for {', '.join(sorted(needs))}")
            batches = list(batches_of(calibration, options.batch_size, input_device(model)))
            if not batches:
                raise ValueError("calibration holds no token ids")
            check_fits_model(model, batches)
        elif set(wanted) - {"layers"}:  # the cuts are checked on one batch
            check_batch = _check_batch(model, calibration, options.batch_size)
        width = _width_config(config, plans, instance, widths=not across)
        precision = options.matmul_precision
        if ranks is not None:
            if follower is not None:
                follower.over_ranks(ranks, len(batches))
            ranks.agree("prunereg.shrink", fingerprint(model, instance, options, batches))
        return cls(
            model, instance, name, blocks_path, block_list, plans, layers, needs, batches, precision, width,
            options.allocation, check_batch, follower, ranks,
        )  # fmt: skip

    def run(
        self, progress: bool | None, weights: BlockWeights | None = None, *, restore_on_error: bool = True
    ) -> ShrinkReport:
        """Shrink every block in turn, then remove blocks and rewrite the config.

        ``weights`` fetches each block's weights before it runs and takes them
        back after (streaming; default: all in memory). ``restore_on_error``
        keeps what each removal replaced, to put the model back on a failure.
        """
        weights = weights if weights is not None else InMemory()
        start = time.perf_counter()
        config = self.model.config
        config_before = dict(vars(config))
        journal = Journal(enabled=restore_on_error)
        report = ShrinkReport(self.method_name, _n_params(self.model), 0, 0, self.blocks_path)
        across = self.allocation == "global"
        shapes_before = _outside_blocks(slimmed.snapshot(self.model), self.blocks_path) if across else None
        try:
            with calibration_mode(self.model), matmul_precision(self.matmul_precision):
                calibrated = bool(self.needs) or self.follower is not None
                inputs = None
                if calibrated:  # this rank's share of the batches (all of them in one process)
                    inputs = capture_first_block_inputs(
                        self.model, self.blocks[0], *own_batches(self.ranks, self.batches)
                    )
                probe = self._probe(inputs) if self.follower is None else None
                student = self._start_follower(inputs, journal)
                report.n_tokens = sum(batch.numel() for batch in self.batches) if calibrated else 0
                label = f"{self.method_name} {self.blocks_path}"
                if across:  # every block's scores first (on the dense model's activations), then the cuts
                    observations = self._observe_all(inputs, progress, label)
                    self._allocate_across_blocks(observations)
                    kinds = [plan.cut() for plan in self.plans]
                    for index, observation in enumerate(observations):
                        report.blocks.append(self._cut_block(index, observation, journal))
                    if probe is not None:  # the cuts checked on one batch, through the blocks as shrunk
                        for index, block_kinds in enumerate(kinds):
                            self._run_cut(index, probe, journal, block_kinds)
                else:
                    for index in progress_bar(range(len(self.blocks)), label=label, enabled=progress):
                        if student is not None and inputs is not None:
                            report.blocks.append(self._shrink_and_follow(index, inputs, student, journal, weights))
                        else:
                            report.blocks.append(self._shrink_block(index, inputs, probe, journal, weights))
                    if self.follower is not None:
                        self.follower.finish(self.model)
            if self.ranks is not None:  # a rank that failed after the last statistics fails every rank's run here
                self.ranks.exchange(None)
            if self.layers:
                scores = [block.score for block in report.blocks]
                order = removal_order(torch.tensor(scores, dtype=torch.float64))
                report.removed_blocks = sorted(order[: self.layers].tolist())
                for index in report.removed_blocks:
                    report.blocks[index].removed = True
                remove_blocks(self.blocks, report.removed_blocks, journal)
            _rewrite_config(config, self.width, report, self.blocks)
            if shapes_before is not None:  # the blocks' widths differ: recorded as slimming records them
                setattr(config, slimmed.CONFIG_KEY, slimmed.record(self.model, shapes_before))
                report.needs_prunereg_loader = True
        except BaseException:
            journal.restore()
            vars(config).clear()
            vars(config).update(config_before)
            raise
        report.config = {
            key: [config_before.get(key), value]
            for key, value in vars(config).items()
            if config_before.get(key) != value and key != slimmed.CONFIG_KEY
        }
        report.params_after = _n_params(self.model)
        report.seconds = time.perf_counter() - start
        return report

    def _shrink_block(
        self, index: int, inputs: BlockInputs | None, probe: BlockInputs | None, journal: Journal,
        weights: BlockWeights,
    ) -> BlockShrink:  # fmt: skip
        block, plan = self.blocks[index], self.plans[index]
        weights.fetch(index, block)
        observation = None
        more = index + 1 < len(self.blocks)
        kinds = plan.cut()
        if inputs is not None:
            # Unchanged, or observed as the dense model: this pass's outputs feed the next block.
            keep = (not kinds or self.method.OBSERVES_DENSE_MODEL) and more
            observation = self._observe(index, inputs, keep_outputs=keep)
        result = self._cut_block(index, observation, journal)
        if inputs is not None and observation is not None and more:
            if observation.outputs:  # unchanged, or observed as the dense model: they feed the next block
                inputs.hidden = observation.outputs
            else:  # the cut block runs once more, which checks the cut: its outputs feed the next
                self._run_cut(index, inputs, journal, kinds)
        if probe is not None:  # the one batch that checks the cuts goes through every block as shrunk
            self._run_cut(index, probe, journal, kinds)
        elif inputs is not None and not more and kinds:  # the last block: one batch checks its cut
            self._run_cut(index, BlockInputs(inputs.hidden[:1], inputs.args[:1], inputs.kwargs[:1]), journal, kinds)
        weights.done(index, block, pruned=True)
        return result

    def _start_follower(self, inputs: BlockInputs | None, journal: Journal) -> BlockInputs | None:
        """The inputs along the shrunk model's trajectory when a follower runs (a list of its own where the
        method observes the dense model), after the follower's start; None without one."""
        if self.follower is None or inputs is None:
            return None
        self.follower.start(self.model, self.blocks, journal)
        if not self.method.OBSERVES_DENSE_MODEL:
            return inputs
        return BlockInputs(list(inputs.hidden), inputs.args, inputs.kwargs, inputs.first)

    def _shrink_and_follow(
        self, index: int, inputs: BlockInputs, student: BlockInputs, journal: Journal, weights: BlockWeights
    ) -> BlockShrink:
        """Shrink block ``index`` with a follower: observed (its outputs kept), cut, then handed to the follower.

        The follower's outputs feed the next block on the shrunk trajectory; a
        method that observes the dense model keeps the dense outputs as its own next inputs.
        """
        assert self.follower is not None
        block = self.blocks[index]
        weights.fetch(index, block)
        with self.follower.watching(index, block):
            observation = self._observe(index, inputs, keep_outputs=True)
        result = self._cut_block(index, observation, journal)
        dense_inputs = None
        if student is not inputs:  # the dense inputs are done with (unless the follower reads them): let go
            dense_inputs = inputs.hidden if self.follower.reads_dense_inputs else None
            inputs.hidden = observation.outputs
        with _config_as(self.model.config, self.width):  # a method's own errors pass as they are
            outputs = self.follower.follow(index, block, student, observation.outputs, dense_inputs)
        del dense_inputs
        student.hidden = outputs
        weights.done(index, block, pruned=True)
        return result

    def _probe(self, inputs: BlockInputs | None) -> BlockInputs | None:
        """One batch to run through the blocks as shrunk, where the calibration passes do not run the cut blocks.

        A method that observes every block on the dense model's activations, or
        one that needs no calibration (then :attr:`check_batch`), or a global
        allocation (every block observed before any cut); None where there are
        no cuts, or where each cut block is run again on every batch anyway.
        """
        if inputs is None:
            batch = self.check_batch
            return None if batch is None else capture_first_block_inputs(self.model, self.blocks[0], [batch])
        dense = self.method.OBSERVES_DENSE_MODEL and any(plan.cut() for plan in self.plans)
        if dense or self.allocation == "global":
            return BlockInputs(inputs.hidden[:1], inputs.args[:1], inputs.kwargs[:1])
        return None

    def _run_cut(self, index: int, inputs: BlockInputs, journal: Journal, kinds: list[str]) -> None:
        """Run block ``index``, which lost ``kinds``, on every batch of ``inputs``, its outputs replacing them.

        A failure is one line naming the module that raised.
        """
        where = f"{self.blocks_path}.{index}"
        cut = " and ".join(kinds) or "it"
        restored = " The model is as it was." if journal.enabled else ""

        def message(module: str, error: str) -> str:
            return (
                f"{where} fails its forward once cut: {module} raised {error}; something there still reads the "
                f"width it had (a hook, a buffer or an attribute shrink does not rewrite): remove it, or leave "
                f"{cut} uncut.{restored}"
            )

        with failures_named(self.blocks[index], where, message), _config_as(self.model.config, self.width):
            advance(self.blocks[index], inputs)

    def _observe(self, index: int, inputs: BlockInputs, *, keep_outputs: bool) -> BlockObservation:
        """One calibration pass over block ``index``: the statistics the method needs (and its outputs if kept)."""
        block, plan = self.blocks[index], self.plans[index]
        writers = {kind: group.writer for kind, group in plan.groups.items()}
        experts = Called(plan.experts.experts, plan.experts.n_experts) if plan.experts is not None else None
        where = f"{self.blocks_path}.{index}"

        def message(module: str, error: str) -> str:
            return f"{where} fails its forward on the calibration data before its cut: {module} raised {error}"

        with failures_named(block, where, message):
            return observe_block(
                block, inputs, writers, experts, self.needs, keep_outputs=keep_outputs, ranks=self.ranks
            )

    def _observe_all(
        self, inputs: BlockInputs | None, progress: bool | None, label: str
    ) -> list[BlockObservation | None]:
        """Every block's statistics, each block run as it is (FLAP scores every block of the dense model)."""
        observations: list[BlockObservation | None] = []
        for index in progress_bar(range(len(self.blocks)), label=label, enabled=progress):
            if inputs is None:
                observations.append(None)
                continue
            more = index + 1 < len(self.blocks)
            observation = self._observe(index, inputs, keep_outputs=more)
            if more:  # every batch's output was kept: the next block's inputs
                inputs.hidden = observation.outputs
            observation.outputs = []
            observations.append(observation)
        return observations

    def _allocate_across_blocks(self, observations: list[BlockObservation | None]) -> None:
        """FLAP's adaptive structure: each block's unit scores standardized, the lowest removed across blocks.

        Per kind (MLP channels, key/value groups) as many units go as the uniform
        split removes in all; a block never loses its last unit (its best one is
        kept and the next lowest unit elsewhere goes instead). Sets each plan's ``keep``.
        """
        for kind in ("mlp", "heads"):
            blocks: list[int] = []  # the block of each unit, in block order: ties remove the later unit first
            standards: list[Tensor] = []
            units: dict[int, int] = {}
            to_remove = 0
            for index, plan in enumerate(self.plans):
                if kind not in plan.groups:
                    continue
                group = plan.groups[kind]
                units[index] = group.n_units
                to_remove += group.n_units - plan.keep[kind]
                standards.append(_standardized(self._unit_scores(group, observations[index])))
                blocks += [index] * group.n_units
            removed = dict.fromkeys(units, 0)
            order = removal_order(torch.cat(standards)).tolist() if standards else []
            for index in (blocks[position] for position in order):
                if not to_remove:
                    break
                if units[index] - removed[index] > 1:
                    removed[index] += 1
                    to_remove -= 1
            for index, count in removed.items():
                self.plans[index].keep[kind] = units[index] - count

    def _cut_block(self, index: int, observation: BlockObservation | None, journal: Journal) -> BlockShrink:
        """Score block ``index`` and remove its lowest units as planned: its report row."""
        plan = self.plans[index]
        result = BlockShrink(index)
        if self.layers:
            statistics = observation.block if observation is not None else BlockStatistics(0, 0.0)
            result.score = float(self.method.block_score(statistics))
        with matmul_precision("highest"):
            for kind, group in plan.groups.items():
                result.before[kind] = group.n_units
                result.kept[kind] = plan.keep[kind]
                if plan.keep[kind] < group.n_units:
                    self._shrink_group(group, plan.keep[kind], observation, journal)
                elif group.bias_flag in self.width and group.writer.bias is None:
                    add_zero_biases(group.owner, journal)  # the config creates the biases in every block
            if plan.experts is not None and plan.keep_experts:
                result.before["experts"] = plan.experts.n_experts
                result.kept["experts"] = plan.keep_experts
                if plan.keep_experts < plan.experts.n_experts:
                    kept = self._kept_experts(plan.experts, plan.keep_experts, observation)
                    remove_experts(plan.experts, kept, journal)
        return result

    def _unit_scores(self, group: UnitGroup, observation: BlockObservation | None) -> Tensor:
        statistics = observation.channels.get(group.kind, _NONE) if observation is not None else _NONE
        weight = group.writer_weight().detach().float()
        scores = _checked_scores(self.method.channel_scores(weight, statistics), weight.shape[1], "channel_scores")
        per_unit = scores.reshape(group.n_units, group.channels_per_unit)
        return _checked_scores(self.method.unit_scores(per_unit, group.kind), group.n_units, "unit_scores")

    def _shrink_group(
        self, group: UnitGroup, keep: int, observation: BlockObservation | None, journal: Journal
    ) -> None:
        statistics = observation.channels.get(group.kind, _NONE) if observation is not None else _NONE
        kept, removed = _split(self._unit_scores(group, observation), keep)
        if self.method.compensates_bias and removed.numel():
            assert statistics.mean is not None  # needs() asked for channel_moments
            if group.writer.bias is None:
                add_zero_biases(group.owner, journal)
                group.cut_new_biases()
            width = group.channels_per_unit
            channels = (removed[:, None] * width + torch.arange(width)).reshape(-1)
            compensate_bias(group, channels, statistics.mean, journal)
        remove_units(group, kept, journal)

    def _kept_experts(self, layer: Experts, keep: int, observation: BlockObservation | None) -> Tensor:
        statistics = observation.experts if observation is not None else None
        if statistics is None:
            zeros = torch.zeros(layer.n_experts)
            statistics = ExpertStatistics(zeros, zeros, zeros, zeros)
        scores = _checked_scores(self.method.expert_scores(statistics), layer.n_experts, "expert_scores")
        return _split(scores, keep)[0]


# -- checks -------------------------------------------------------------------------------


def _build_method(method: str | ShrinkMethod, options: dict[str, Any]) -> tuple[ShrinkMethod, str]:
    from prunereg._plugins.loading import configured_method

    return configured_method(method, ShrinkMethod, "shrink", options)


def _check_followable(options: ShrinkOptions, calibration: object) -> None:
    """Refuse what recovery in shrinking's own pass cannot follow, in one line, before anything changes."""
    if calibration is None:
        raise ValueError(f"recover={options.recover!r} needs calibration data: token ids, or texts with a tokenizer")
    if options.layers:
        raise ValueError(
            f"recover={options.recover!r} cannot follow layers=: the blocks removed are known only after the pass; "
            "shrink, then run prunereg.recover(model, teacher, ..., removed_blocks=report.removed_blocks)"
        )
    if options.allocation == "global":
        raise ValueError(
            f"recover={options.recover!r} needs allocation='uniform': a global allocation cuts every block "
            "after the pass; shrink, then run prunereg.recover with a copy of the model as the teacher"
        )


def _check_global(method: ShrinkMethod, name: str, wanted: list[str]) -> None:
    """Refuse ``allocation="global"`` for a method whose scores do not compare across blocks, or with no width cut."""
    if not method.ALLOCATES_ACROSS_BLOCKS:
        raise ValueError(
            f"allocation='global' ranks units across blocks, and {name}'s scores are not meant to be compared "
            "across blocks; use allocation='uniform' (or flap)"
        )
    if not {"mlp", "heads"} & set(wanted):
        raise ValueError("allocation='global' spreads the mlp and heads removal over the blocks; give mlp or heads")


def _standardized(scores: Tensor) -> Tensor:
    """``scores`` less their mean, over their standard deviation (zero when they do not vary), of the numbers.

    A NaN score stays NaN (removed first, as everywhere) and is left out of the mean and the spread.
    """
    scores = scores.double()
    numbers = scores[~scores.isnan()]
    spread = numbers.std() if numbers.numel() > 1 else scores.new_zeros(())
    if not bool(spread > 0):
        return torch.where(scores.isnan(), scores, 0.0)
    return (scores - numbers.mean()) / spread


def _outside_blocks(shapes: slimmed.Record, blocks_path: str) -> slimmed.Record:
    """A snapshot less the blocks: every block's shapes are then recorded (blocks may also be renumbered)."""
    inside = blocks_path + "."
    return {part: {k: v for k, v in entries.items() if not k.startswith(inside)} for part, entries in shapes.items()}


def _plan_block(
    where: str, block: nn.Module, config: Any, shares: dict[str, float], method: ShrinkMethod, name: str
) -> BlockPlan:
    plan = BlockPlan()
    for kind, finder, unit in (("mlp", find_mlp, "channel"), ("heads", find_heads, "key/value group")):
        share = shares[kind]
        if not share:
            continue
        found = finder(block, config)
        if isinstance(found, str):
            raise ValueError(f"cannot remove {kind} of {where}: {found}")
        if not found.writer_weight().dtype.is_floating_point:
            raise TypeError(f"{where} has {found.writer_weight().dtype} weights; shrink needs floating-point ones")
        keep = found.n_units - round(share * found.n_units)
        if keep < 1:
            raise ValueError(f"{kind}={share:g} would leave no {unit} of the {found.n_units} in {where}")
        if method.compensates_bias and found.bias_flag is not None and not hasattr(config, found.bias_flag):
            raise ValueError(
                f"{name} adds a bias compensation to {where}'s {type(found.writer).__name__} output projection, "
                f"which has no bias, and {type(config).__name__} has no {found.bias_flag!r} to create one "
                "(pass compensate=False to score without it)"
            )
        plan.groups[kind], plan.keep[kind] = found, keep
    if shares["experts"]:
        layer = find_experts(block)
        if layer is not None:
            keep = layer.n_experts - round(shares["experts"] * layer.n_experts)
            top_k = getattr(layer.router, "top_k", None) or getattr(config, "num_experts_per_tok", None) or 1
            if keep < max(1, int(top_k)):
                raise ValueError(
                    f"experts={shares['experts']:g} would leave {keep} of the {layer.n_experts} experts in {where}, "
                    f"fewer than the {top_k} each token is routed to"
                )
            plan.experts, plan.keep_experts = layer, keep
    return plan


def _refuse_sharing(
    model: nn.Module, blocks: nn.ModuleList, plans: list[BlockPlan], layers: int, *, with_biases: bool
) -> None:
    """Refuse a module or tensor this run changes that the model holds in two places (see :func:`refuse_sharing`)."""
    modules: list[nn.Module] = list(blocks) if layers else []  # blocks are taken out of the list and renumbered
    tensors: list[Tensor] = []
    for plan in plans:
        for group in plan.groups.values():
            changed, cut = group.changed(with_biases=with_biases)
            modules += changed
            tensors += cut
        if plan.experts is not None:
            modules += [plan.experts.owner, plan.experts.router, plan.experts.experts]
            tensors += [tensor for _, _, tensor in plan.experts.sliced()]
    if layers:
        modules += [m for block in blocks for m in block.modules() if isinstance(getattr(m, "layer_idx", None), int)]
    refuse_sharing(model, modules, tensors)


def _check_batch(model: nn.Module, calibration: Tensor | Iterable[Tensor] | None, batch_size: int) -> Tensor:
    """The token ids that check the cuts where no statistics are gathered: the first batch, or a short made-up one."""
    device = input_device(model)
    for batch in batches_of(calibration, batch_size, device) if calibration is not None else ():
        check_fits_model(model, [batch])
        return batch
    config = getattr(model, "config", None)
    limits = [getattr(config, key, None) for key in ("max_position_embeddings", "n_positions")]
    length = min([8, *(limit for limit in limits if isinstance(limit, int) and not isinstance(limit, bool))])
    return torch.zeros((1, max(length, 1)), dtype=torch.long, device=device)


def _check_config(config: Any, plans: list[BlockPlan], layers: int, *, same_width: bool = True) -> None:
    """Refuse what the config cannot state: a size it has no key for, or blocks that would differ.

    ``same_width=False`` (a per-block allocation) lets the blocks' widths differ: they are recorded instead.
    """
    if same_width and any("mlp" in plan.groups for plan in plans) and _mlp_key(config) is None:
        raise ValueError(
            f"{type(config).__name__} has no intermediate_size (or n_inner, ffn_dim) to state the MLP width"
        )
    for kind in ("mlp", "heads") if same_width else ():
        shapes = {(plan.groups[kind].n_units, plan.keep[kind]) for plan in plans if kind in plan.groups}
        if len(shapes) > 1:
            raise ValueError(f"the blocks' {kind} differ in size, which one config value cannot state")
    expert_shapes = {(plan.experts.n_experts, plan.keep_experts) for plan in plans if plan.experts is not None}
    if len(expert_shapes) > 1:
        raise ValueError("the blocks' expert counts differ, which one config value cannot state")
    if expert_shapes and _expert_key(config) is None:
        raise ValueError(f"{type(config).__name__} has no num_local_experts or num_experts to state the new count")
    if layers and not isinstance(getattr(config, "num_hidden_layers", None), int):
        raise ValueError(f"{type(config).__name__} has no num_hidden_layers to state the new depth")


def _mlp_key(config: Any) -> str | None:
    return next((key for key in ("intermediate_size", "n_inner", "ffn_dim") if hasattr(config, key)), None)


def _expert_key(config: Any) -> str | None:
    return next((key for key in ("num_local_experts", "num_experts") if hasattr(config, key)), None)


def _checked_scores(scores: object, size: int, what: str) -> Tensor:
    if not isinstance(scores, Tensor) or tuple(scores.shape) != (size,):
        shape = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"{what} must return a tensor of shape ({size},), got {shape}")
    return scores.detach().float().cpu()


def _split(scores: Tensor, keep: int) -> tuple[Tensor, Tensor]:
    """The indices of the ``keep`` units kept and of the others, each sorted, by :func:`removal_order` (NaN first)."""
    order = removal_order(scores)
    gone = len(order) - keep
    return order[gone:].sort().values, order[:gone].sort().values


def _n_params(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def _width_config(config: Any, plans: list[BlockPlan], method: ShrinkMethod, *, widths: bool = True) -> dict[str, Any]:
    """The config values that state the blocks' new width: every block lost the same, so one value per key.

    ``widths=False`` (the blocks' widths differ): only the bias flags a compensation needs, and the expert count.
    """
    values: dict[str, Any] = {}
    first = {kind: plan for plan in reversed(plans) for kind in plan.groups}
    if "mlp" in first:
        plan = first["mlp"]
        if widths:
            values[str(_mlp_key(config))] = plan.keep["mlp"]
        flag = plan.groups["mlp"].bias_flag
        if method.compensates_bias and flag is not None:
            values[flag] = True
    if "heads" in first:
        plan = first["heads"]
        group = plan.groups["heads"]
        if widths:
            values["head_dim"] = group.channels_per_unit // group.query_heads_per_unit
            values["num_attention_heads"] = plan.keep["heads"] * group.query_heads_per_unit
            if hasattr(config, "num_key_value_heads"):
                values["num_key_value_heads"] = plan.keep["heads"]
        if method.compensates_bias and group.bias_flag is not None:
            values[group.bias_flag] = True
    with_experts = [plan for plan in plans if plan.experts is not None and plan.keep_experts]
    if with_experts:
        values[str(_expert_key(config))] = with_experts[0].keep_experts
    return values


@contextlib.contextmanager
def _config_as(config: Any, values: dict[str, Any]) -> Iterator[None]:
    """``config`` with ``values`` set inside the block (a shrunk block whose code reads the config runs right)."""
    saved = dict(vars(config))
    for key, value in values.items():
        setattr(config, key, value)
    try:
        yield
    finally:
        vars(config).clear()
        vars(config).update(saved)


def _rewrite_config(config: Any, width: dict[str, Any], report: ShrinkReport, blocks: nn.ModuleList) -> None:
    """State the new shape in ``config``: the new width, and the new depth if blocks were removed."""
    for key, value in width.items():
        setattr(config, key, value)
    if report.removed_blocks:
        removed = set(report.removed_blocks)
        n_before = len(report.blocks)
        config.num_hidden_layers = len(blocks)
        layer_types = getattr(config, "layer_types", None)
        if isinstance(layer_types, list) and len(layer_types) == n_before:
            config.layer_types = [kind for i, kind in enumerate(layer_types) if i not in removed]
        if isinstance(getattr(config, "mlp_only_layers", None), list):
            config.mlp_only_layers = [i for i, block in enumerate(blocks) if find_experts(block) is None]
            config.decoder_sparse_step = 1
