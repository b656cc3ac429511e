"""``prunereg.recover``: bring a shrunk or pruned model's outputs back to its teacher's, block by block.

The loop is the one-shot engine's, run on two models side by side: the
calibration set is run up to the first block of the model (the *student*) and
of the dense model it came from (the *teacher*); then for each block of the
student, the teacher's matching blocks (its own, and those removed right after
it) advance the teacher's hidden states, which become the block's targets, the
method recovers the block (:func:`prunereg._recover.step.recover_block`), and
the block as it is left advances the student's hidden states. Each block thus
learns from inputs that the blocks before it, already recovered, produce, and
matches what the dense model produced at the same place. Memory: both models'
weights, and per calibration batch the two models' hidden states (three with
an attention refit's targets).

Every argument is checked before anything changes: a refusal (no calibration,
a teacher of other shapes, no blocks found) leaves the model as it was.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from torch import Tensor, nn

from prunereg._progress import progress as progress_bar
from prunereg._recover.contract import RecoveryMethod
from prunereg._recover.data import RecoveryBlock, RecoveryModel, zero_masks
from prunereg._recover.matching import Matching, match_blocks
from prunereg._recover.options import RecoverOptions
from prunereg._recover.parts import BlockParts, bias_flags, block_parts, changed_parts
from prunereg._recover.report import RecoverReport
from prunereg._recover.runtime import (
    BlockInputs,
    BlockWeights,
    Ranks,
    add_zero_biases,
    batches_of,
    calibration_ids,
    calibration_mode,
    capture_first_block_inputs,
    check_fits_model,
    check_not_reparametrized,
    check_sharded_run,
    digest,
    find_blocks,
    fingerprint,
    input_device,
    is_sharded,
    matmul_precision,
    model_digest,
    own_batches,
    sharded_run,
    together,
)
from prunereg._recover.step import recover_block, recover_model
from prunereg._recover.teacher import TeacherTrajectory
from prunereg._runtime.options import with_options_signature


@with_options_signature(RecoverOptions)
def recover(
    model: nn.Module,
    teacher: nn.Module,
    calibration: Any,
    method: str | RecoveryMethod = "refit",
    *,
    tokenizer: Any = None,
    num_samples: int | None = None,
    seq_len: int | None = None,
    **options: Any,
) -> RecoverReport:
    """Bring the outputs of a model that ``prunereg.shrink`` or ``oneshot`` left back towards ``teacher``'s, in place.

    ``teacher`` is the model before shrinking or pruning (same architecture, its
    tensors at least as large), ``calibration`` what :func:`prunereg.oneshot`
    takes (token ids, or texts with ``tokenizer``, cut into ``num_samples`` x
    ``seq_len``). ``method`` is a registered name of kind ``recovery``
    (``"refit"``, ``"replace"``, ``"blockwise"``, ``"distill"``) or a configured
    :class:`prunereg.RecoveryMethod`; any keyword that is not a setting below is
    an option of the method (``ridge=1e-3``, ``epochs=3``).

    Block ``i`` of the model is the teacher's block ``i``, unless blocks were
    removed: ``removed_blocks`` names them (``ShrinkReport.removed_blocks``),
    or they are found by comparing the tensors shrinking leaves unchanged.
    Each block's method sees the block's inputs along the recovered model's own
    trajectory and the dense model's outputs there (after the removed blocks
    that followed it). Only the values of existing parameters change, and on a
    masked model (from ``oneshot``) only its non-zero weights: every zero stays
    zero. A method that asks for it gets a zero bias in each block's writer
    projections first, where the config has a flag that makes stock
    ``from_pretrained`` build it (``mlp_bias``, ``attention_bias``), so the
    model still reloads with stock ``transformers``.

    A block (or model) that the method leaves worse on the calibration
    objective is put back as it was, and the report says so. A refusal (no
    calibration, a teacher of other shapes, no blocks found, an unknown
    option) is a one-line error and leaves the model as it was. If the method
    fails midway (or, under ranks, another rank does, or the ranks' blocks
    differ), the block it was working on is put back, the biases no recovered
    block uses are taken back with their config flags, and the error says
    which blocks were recovered before it.

    Under torch.distributed (``torchrun``; ``data_parallel=False`` opts out)
    each rank runs a share of the calibration batches and the ranks combine
    the statistics and losses, so every rank ends with the model one process
    gives from all the samples, bit for bit; only a method that reads the
    batches through them (``DATA_PARALLEL``: ``refit``, ``replace``) runs so,
    and ranks that disagree on the models, method or samples are refused. A
    model or teacher sharded with FSDP2 (``fully_shard`` on each block and the
    root) is recovered one block at a time, each gathered whole and the
    recovered values written into every rank's own shards; it cannot gain
    parameters (``bias=False`` where the config has no writer biases).
    """
    settings, method_options = RecoverOptions.split(options)
    if calibration is None:
        raise ValueError("recover needs calibration data: token ids, or texts with a tokenizer")
    calibration = calibration_ids(calibration, tokenizer=tokenizer, num_samples=num_samples, seq_len=seq_len)
    ranks = Ranks.current(settings.data_parallel)
    with together(ranks):
        job = RecoverJob.prepare(model, teacher, calibration, method, settings, method_options, ranks=ranks)
        return job.run()


@dataclass
class RecoverJob:
    """A checked recovery request: the method, both models' blocks and how they match, the calibration batches."""

    model: nn.Module
    teacher: nn.Module
    method: RecoveryMethod
    method_name: str
    blocks_path: str
    blocks: nn.ModuleList
    teacher_blocks: nn.ModuleList
    matching: Matching
    batches: list[Tensor]
    teacher_batches: list[Tensor]
    bias_flags: dict[str, list[nn.Module]]
    options: RecoverOptions
    ranks: Ranks | None = None
    """The ranks that split the calibration batches and combine what the method reads (None: this process alone)."""

    @classmethod
    def prepare(
        cls,
        model: nn.Module,
        teacher: nn.Module,
        calibration: Tensor | Iterable[Tensor],
        method: str | RecoveryMethod,
        options: RecoverOptions,
        method_options: dict[str, Any],
        *,
        ranks: Ranks | None = None,
    ) -> RecoverJob:
        """Check every argument and build the method; nothing in ``model`` changes.

        With ``ranks``, the method must split its data over them, every rank
        needs a batch, and every rank's request is checked against the others'.
        """
        for name, value in (("model", model), ("teacher", teacher)):
            if not isinstance(value, nn.Module):
                raise TypeError(f"{name} must be a torch.nn.Module, not {type(value).__name__}")
        if teacher is model:
            raise ValueError("the teacher is the model itself; pass the model before shrinking (a copy of it)")
        models = {"model": model, "teacher": teacher}
        sharded = [name for name, value in models.items() if is_sharded(value)]
        for name in sharded:
            check_sharded_run(models[name], f"prunereg.recover ({name})", ranks)
        instance, name = build_method(method, method_options)
        path, blocks = find_blocks(model, options.blocks)
        teacher_path, teacher_blocks = find_blocks(teacher, options.blocks)
        if teacher_path != path:
            raise ValueError(f"the model keeps its blocks in {path} and the teacher in {teacher_path}")
        if sharded and options.removed_blocks is None and len(blocks) != len(teacher_blocks):
            raise ValueError(
                f"prunereg.recover ({sharded[0]}): the teacher has {len(teacher_blocks)} blocks in {path} and the "
                f"model {len(blocks)}, and a sharded model's blocks are not compared to find which went: pass "
                "removed_blocks= (ShrinkReport.removed_blocks)"
            )
        check_not_reparametrized(model)
        check_not_reparametrized(teacher)
        _check_embeddings(model, teacher)
        matching = match_blocks(blocks, teacher_blocks, options.removed_blocks, path)
        batches = list(batches_of(calibration, options.batch_size, input_device(model)))
        if not batches:
            raise ValueError("calibration holds no token ids")
        check_fits_model(model, batches)
        teacher_device = input_device(teacher)
        teacher_batches = [batch.to(teacher_device) for batch in batches]
        config = getattr(model, "config", None)
        flags = bias_flags(config, blocks, instance.writer_biases) if instance.SCOPE == "block" else {}
        if flags and "model" in sharded:
            raise NotImplementedError(
                f"prunereg.recover (model): {name!r} would give the sharded model new biases ({', '.join(flags)}), "
                "which fully_shard did not shard: pass bias=False, or set the flag before building and sharding it"
            )
        if ranks is not None:
            check_data_parallel(instance, name, ranks, len(batches))
            shared = fingerprint(model, instance, options, batches)
            ranks.agree("prunereg.recover", {**shared, "teacher": model_digest(teacher)})
        return cls(
            model, teacher, instance, name, path, blocks, teacher_blocks, matching, batches, teacher_batches, flags,
            options, ranks,
        )  # fmt: skip

    def run(self) -> RecoverReport:
        """Recover every block in turn (or the whole model), with any writer biases switched on first."""
        start = time.perf_counter()
        report = RecoverReport(self.method_name, self.blocks_path, sum(batch.numel() for batch in self.batches))
        config = getattr(self.model, "config", None)
        config_before = dict(vars(config)) if config is not None else {}
        precision = matmul_precision(self.options.matmul_precision)
        with calibration_mode(self.model), calibration_mode(self.teacher), precision:
            added = switch_on_biases(config, self.bias_flags)
            try:
                if self.method.SCOPE == "model":
                    report.steps.append(recover_model(self.method, self._whole_model()))
                else:  # FSDP2: each block of either model gathered whole in turn
                    with (
                        sharded_run(self.model, self.blocks, self.ranks) as student,
                        sharded_run(self.teacher, self.teacher_blocks, self.ranks) as teacher,
                    ):
                        self._recover_blocks(report, student, teacher)
            finally:  # a failure too: the biases no recovered block uses go, with their flags
                switch_off_unused(added, config, config_before)
        report.config = config_changes(config, config_before)
        report.seconds = time.perf_counter() - start
        return report

    def _whole_model(self) -> RecoveryModel:
        student = self.model
        getter = getattr(student, "get_input_embeddings", None)
        embeddings = getter() if callable(getter) else None
        masks = zero_masks(student)
        if isinstance(embeddings, nn.Module):  # never trained: its zeros (a padding row) need no mask
            masks = {k: v for k, v in masks.items() if not k.startswith(_prefix(student, embeddings))}
        return RecoveryModel(
            student, self.teacher, self.batches, masks, seed=self.options.seed, show_progress=self.options.progress
        )

    def _recover_blocks(self, report: RecoverReport, student: BlockWeights, teacher_weights: BlockWeights) -> None:
        """Each block in turn, on this rank's share of the batches (all of them in one process).

        ``student`` and ``teacher_weights`` fetch each model's blocks as they
        run and take them back after (the student's with its recovered values).
        """
        with student.capturing():
            student_inputs = capture_first_block_inputs(
                self.model, self.blocks[0], *own_batches(self.ranks, self.batches)
            )
        with teacher_weights.capturing():
            teacher_inputs = capture_first_block_inputs(
                self.teacher, self.teacher_blocks[0], *own_batches(self.ranks, self.teacher_batches)
            )
        teacher = TeacherTrajectory(self.teacher_blocks, teacher_inputs, teacher_weights)
        teacher.run(self.matching.leading)
        label = f"{self.method_name} {self.blocks_path}"
        for index in progress_bar(range(len(self.blocks)), label=label, enabled=self.options.progress):
            span = self.matching.spans[index]
            module = self.blocks[index]
            student.fetch(index, module)
            dense_inputs = teacher.next_inputs() if self.method.reads_dense_inputs else None
            parts = block_parts(module, getattr(self.model, "config", None))
            with teacher.holding(span[0]) as teacher_block:
                changed = changed_parts(parts, module, teacher_block)
                targets, attention = teacher.run(span, attention=self.method.reads_attention_residual(changed))
            block = self._block_data(index, span, parts, changed, student_inputs, targets, attention, dense_inputs)
            try:
                step, outputs = recover_block(self.method, block, lambda done: check_ranks_agree(self.ranks, done))
            except BaseException as error:
                _say_how_far(error, self.blocks_path, index)
                raise
            student.done(index, module, pruned=True)
            report.steps.append(step)
            student_inputs.hidden = outputs
            del block, targets, attention, dense_inputs

    def _block_data(
        self,
        index: int,
        span: tuple[int, ...],
        parts: BlockParts,
        changed: frozenset[str],
        inputs: BlockInputs,
        targets: list[Tensor],
        attention: list[Tensor] | None,
        dense_inputs: list[Tensor] | None,
    ) -> RecoveryBlock:
        module = self.blocks[index]
        return RecoveryBlock(
            module,
            index,
            span,
            inputs,
            targets,
            writers=parts.writers,
            mlp=parts.mlp,
            changed=changed,
            attention_targets=attention,
            masks=zero_masks(module),
            seed=self.options.seed,
            show_progress=self.options.progress,
            label=f"{self.blocks_path}.{index}",
            ranks=self.ranks,
            dense_inputs=dense_inputs,
        )


def check_data_parallel(method: RecoveryMethod, name: str, ranks: Ranks, n_batches: int) -> None:
    """Refuse, in one line, a recovery over ``ranks`` that could not end as one process's: see ``DATA_PARALLEL``."""
    if not method.DATA_PARALLEL:
        raise ValueError(
            f"recover={name!r} trains on the calibration batches itself, which the {ranks.size} ranks of "
            "torch.distributed would split: pass data_parallel=False (every rank then recovers on all the samples), "
            "or run it in one process"
        )
    if n_batches < ranks.size:
        raise ValueError(
            f"{ranks.size} ranks need a calibration batch each, and there are {n_batches}: "
            "give more samples or a smaller batch_size"
        )


def check_ranks_agree(ranks: Ranks | None, block: RecoveryBlock) -> None:
    """Refuse a recovered block whose weights differ between ranks (a method that read its own share of the data)."""
    if ranks is None:
        return
    weights = digest(*(tensor for _, tensor in sorted(block.module.state_dict().items())))
    if len(set(ranks.exchange(weights))) > 1:
        raise RuntimeError(
            f"the ranks recovered {block.label or block.index} differently: the method read its own share of the "
            "calibration batches, not only what the block combines over the ranks; pass data_parallel=False"
        )


class _NoJournal:
    """:func:`add_zero_biases` keeps nothing: recovery does not put biases back (a zero bias changes nothing)."""

    enabled = False

    def keep(self, module: nn.Module) -> None:
        pass


_NO_JOURNAL: Any = _NoJournal()


def config_changes(config: Any, before: dict[str, Any]) -> dict[str, list[Any]]:
    """Each key of ``config`` whose value is not the one in ``before``, as ``[before, now]``."""
    if config is None:
        return {}
    return {key: [before.get(key), value] for key, value in vars(config).items() if before.get(key) != value}


def switch_on_biases(
    config: Any, flags: dict[str, list[nn.Module]], journal: Any = _NO_JOURNAL
) -> dict[str, list[nn.Linear]]:
    """Give the Linears of each flag's owners a zero bias, and set the config flag that builds them.

    Returns, per flag, the layers that got a bias (the flag builds one in every
    Linear of the owner). ``journal`` keeps what is replaced (shrinking's, to put back on a failure).
    """
    added: dict[str, list[nn.Linear]] = {}
    for flag, owners in flags.items():
        layers = _linears_without_bias(owners)
        for owner in owners:
            add_zero_biases(owner, journal)
        setattr(config, flag, True)
        added[flag] = layers
    return added


def _linears_without_bias(owners: list[nn.Module]) -> list[nn.Linear]:
    """The ``nn.Linear`` children of ``owners`` that have no bias (those a bias flag gives one)."""
    found: list[nn.Linear] = []
    for owner in owners:
        for module in owner.children():
            if isinstance(module, nn.Linear) and module.bias is None:
                found.append(module)
    return found


def switch_off_unused(added: dict[str, list[nn.Linear]], config: Any, config_before: dict[str, Any]) -> None:
    """Take back the biases of a flag whose biases all stayed zero (no block used them), and the flag."""
    used = {flag for flag, layers in added.items() if any_bias_used(layers)}
    switch_off(added, used, config, config_before)


def any_bias_used(layers: list[nn.Linear]) -> bool:
    """Whether any of ``layers`` holds a bias that is not all zeros."""
    return any(bool(layer.bias.detach().any()) for layer in layers if layer.bias is not None)


def switch_off(added: dict[str, list[nn.Linear]], used: set[str], config: Any, config_before: dict[str, Any]) -> None:
    """Take back the biases of each flag of ``added`` not in ``used``, and the flag (as ``config_before`` had it).

    Only the modules change: a block whose weights were given back (streaming) keeps its written shard.
    """
    for flag, layers in added.items():
        if flag not in used:
            for layer in layers:
                layer.register_parameter("bias", None)
            setattr(config, flag, config_before.get(flag))


def _check_embeddings(model: nn.Module, teacher: nn.Module) -> None:
    """Refuse a teacher whose input embeddings differ in shape from the model's (another vocabulary or width)."""
    shapes = []
    for each in (model, teacher):
        getter = getattr(each, "get_input_embeddings", None)
        embeddings = getter() if callable(getter) else None
        weight = getattr(embeddings, "weight", None)
        shapes.append(tuple(weight.shape) if isinstance(weight, Tensor) else None)
    if None not in shapes and shapes[0] != shapes[1]:
        raise ValueError(
            f"the model's input embeddings are {shapes[0]} and the teacher's {shapes[1]}: "
            "the teacher must be the model before shrinking"
        )


def _prefix(model: nn.Module, module: nn.Module) -> str:
    return next((name + "." for name, each in model.named_modules() if each is module), "\0")


def build_method(method: object, options: dict[str, Any]) -> tuple[RecoveryMethod, str]:
    """The configured method and its name; a one-line TypeError or ValueError for a method or option it refuses
    (``method`` is what a user gave: neither a name nor a recovery method is refused too)."""
    from prunereg._plugins.loading import configured_method

    return configured_method(cast(Any, method), RecoveryMethod, "recover", options)


def _say_how_far(error: BaseException, path: str, index: int) -> None:
    """Tell the caller which blocks were recovered before the one that failed (that one was put back)."""
    done = f"blocks 0 to {index - 1} of {path} are recovered" if index else f"no block of {path} was changed"
    message = f"prunereg.recover stopped at {path}.{index} (put back as it was); {done}"
    add_note = getattr(error, "add_note", None)
    if callable(add_note):
        add_note(message)
