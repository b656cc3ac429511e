"""``prunereg.shrink``: shrinking, with recovery in the same pass (``recover=``) and in rounds (``steps=``).

Shrinking runs each decoder block on the calibration set before cutting it;
those outputs are the dense block's, and recovery needs nothing more as its
teacher: :class:`Recovering` hands each cut block, with its inputs along the
shrunk (and already recovered) model's trajectory and the dense outputs as
targets, to :func:`~prunereg._recover.step.recover_block`. No copy of the
model is kept. A method that observes the dense model (FLAP) sees the dense
model's own trajectory, so the result is that of shrinking then
:func:`prunereg.recover` with the model before shrinking as the teacher; one
that observes the shrunk model's trajectory (Wanda-sp) scores the recovered
blocks' outputs and matches the dense block on them.

``steps=k`` removes what is asked in ``k`` rounds of equal size (in units),
each a shrink run with its recovery; each round's teacher is the model as the
round before left it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._recover.contract import RecoveryMethod
from prunereg._recover.data import RecoveryBlock, zero_masks
from prunereg._recover.engine import (
    any_bias_used,
    build_method,
    check_data_parallel,
    check_ranks_agree,
    config_changes,
    switch_off,
    switch_on_biases,
)
from prunereg._recover.parts import BlockParts, bias_flags, block_parts
from prunereg._recover.report import RecoverReport
from prunereg._recover.runtime import (
    BlockInputs,
    Ranks,
    calibration_ids,
    find_blocks,
    find_experts,
    find_heads,
    find_mlp,
)
from prunereg._recover.step import recover_block
from prunereg._runtime.options import with_options_signature
from prunereg._shrink.contract import BlockFollower, ShrinkMethod
from prunereg._shrink.engine import ShrinkJob, shrink_model
from prunereg._shrink.options import ShrinkOptions
from prunereg._shrink.report import ShrinkReport


@with_options_signature(ShrinkOptions)
def shrink(
    model: nn.Module,
    method: str | ShrinkMethod = "flap",
    calibration: Any = None,
    *,
    tokenizer: Any = None,
    num_samples: int | None = None,
    seq_len: int | None = None,
    **options: Any,
) -> ShrinkReport:
    """Make a causal language model smaller in place: fewer MLP channels, heads, blocks or experts.

    ``method`` is a registered name of kind ``shrink`` (``"flap"``, ``"wanda_sp"``,
    ``"magnitude_sp"``, ``"block_influence"``, ``"reap"``), or a configured
    :class:`prunereg.ShrinkMethod`. ``calibration`` is what :func:`prunereg.oneshot`
    accepts: token ids (``[n_samples, seq_len]``, run in batches of ``batch_size``,
    or an iterable of batches), or a text, texts, a tokenizer's output or a
    dataset, tokenised with ``tokenizer`` and cut into ``num_samples`` x
    ``seq_len``; a method that needs no statistics (``magnitude_sp``) runs without it.

    The other keyword arguments are the run's settings (the table in
    ``docs/shrinking.md``; :class:`prunereg._shrink.options.ShrinkOptions` holds
    their defaults and checks); any other keyword is an option of the method,
    passed to its constructor (``compensate=False``).

    - ``mlp``: the share of each MLP's intermediate channels removed (gate and up
      rows with the down projection's columns);
    - ``heads``: the share of each attention's key/value groups removed, each with
      its query heads (a model without grouped queries: the share of its heads);
    - ``layers``: how many decoder blocks are removed, the lowest-scored;
    - ``experts``: the share of each mixture-of-experts layer's experts removed,
      router rows included.
    - ``recover``: a recovery method of kind ``recovery`` that works block by
      block, by name (``"refit"``, ``"blockwise"``) or configured
      (``prunereg.get("blockwise")(epochs=3, lr=3e-3)``), run on each block right after its
      cut against the dense block's outputs that the shrink pass already
      computes (no copy of the model): with a method that observes the dense
      model (FLAP) the same result as shrinking then :func:`prunereg.recover`
      with the model before as the teacher. ``ShrinkReport.recovery`` is its
      :class:`prunereg.RecoverReport`. Not with ``layers`` or
      ``allocation="global"`` (the cuts are known only after the pass: run
      :func:`prunereg.recover` after shrinking).
    - ``steps``: remove what is asked in that many rounds of equal size, each
      with its recovery (ModelOpt's advice above ~50 %: compress, recover,
      compress again); each round's teacher is the model the round before left.

    With ``allocation="uniform"`` (the default) every block loses the same number
    of units and the config is rewritten (``intermediate_size``,
    ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
    ``num_hidden_layers``, ``layer_types``, ``num_local_experts`` /
    ``num_experts``, and ``mlp_bias`` / ``attention_bias`` where a method adds a
    bias compensation), so ``save_pretrained`` then stock
    ``AutoModelForCausalLM.from_pretrained`` gives the same logits.
    ``allocation="global"`` (FLAP's adaptive structure) standardizes each block's
    scores and removes the lowest across all blocks, so blocks keep different
    widths: the config records them (``prunereg_slimmed``, as slimming does) and
    the saved model loads with :func:`prunereg.from_pretrained`.

    ``matmul_precision`` is torch's float32 matmul precision of the calibration
    forwards (see :func:`prunereg.oneshot`); statistics and scores run in full
    float32. A request the model or its config cannot express raises a one-line
    ``ValueError`` (or ``TypeError``) before anything changes. If shrinking fails
    midway, ``restore_on_error=True`` puts every replaced tensor, attribute and
    config value back before the error propagates: the replaced tensors are kept
    until the call returns (up to a second copy of the shrunk layers); ``False``
    keeps nothing, and a failure leaves the model half shrunk.
    """
    settings, method_options = ShrinkOptions.split(options)
    if calibration is not None:
        calibration = calibration_ids(calibration, tokenizer=tokenizer, num_samples=num_samples, seq_len=seq_len)
    if settings.steps == 1:
        return _shrink_once(model, method, calibration, settings, method_options)
    rounds = planned_rounds(model, method, calibration, settings, method_options)
    return combined([_shrink_once(model, method, calibration, each, method_options) for each in rounds])


def _shrink_once(
    model: nn.Module,
    method: str | ShrinkMethod,
    calibration: Any,
    settings: ShrinkOptions,
    method_options: dict[str, Any],
) -> ShrinkReport:
    follower = follower_for(settings)
    report = shrink_model(model, method, calibration, settings, method_options, follower)
    if follower is not None:
        report.recovery = follower.report
    return report


def follower_for(settings: ShrinkOptions) -> Recovering | None:
    """The recovery that follows each cut of a run with ``settings`` (None without ``recover``); refused in one
    line if its method does not work block by block."""
    if settings.recover is None:
        return None
    instance, name = build_method(settings.recover, {})
    if not isinstance(settings.recover, str):
        name = repr(instance)  # a configured method: its options show in the report
    if instance.SCOPE != "block":
        raise ValueError(
            f"recover={name!r} trains the whole model against a teacher model, which shrinking does not keep; "
            "shrink, then run prunereg.recover with a copy of the model before as the teacher"
        )
    return Recovering(instance, name, progress=settings.progress)


class Recovering(BlockFollower):
    """Recovery as shrinking's follower: each cut block recovered against the dense block's outputs.

    Each writer bias the method asks for is switched on where the config can
    (decided before the pass, added to each block after its cut, through
    shrinking's journal, so a failure takes it back);
    with ``restore_on_error`` each block's parameters are copies while the
    method works on them, so a failure puts the originals back. ``report``
    collects one row per block. Whether a block uses its new biases is noted
    right after its recovery, and :meth:`finish` reads only those notes: a
    streamed block's weights are given back by then (its shard already written).
    """

    def __init__(self, method: RecoveryMethod, name: str, *, progress: bool | None = None) -> None:
        self.method = method
        self.name = name
        self.ranks: Ranks | None = None
        self.report = RecoverReport(name, "", 0)
        self.progress = progress
        self._config: Any = None
        self._journal: Any = None
        self._flags: dict[str, list[nn.Module]] = {}
        self._added: dict[str, list[nn.Linear]] = {}
        self._used: set[str] = set()
        self._config_before: dict[str, Any] = {}
        self._parts: BlockParts | None = None
        self._before: dict[str, list[tuple[int, int]]] = {}
        self._mlp_outputs: list[Tensor] = []
        self._start = 0.0

    def over_ranks(self, ranks: Ranks, n_batches: int) -> None:
        check_data_parallel(self.method, self.name, ranks, n_batches)
        self.ranks = ranks

    def start(self, model: nn.Module, blocks: nn.ModuleList, journal: Any) -> None:
        self._start = time.perf_counter()
        self._config = getattr(model, "config", None)
        self._journal = journal
        self.report.blocks_path = next((name for name, module in model.named_modules() if module is blocks), "")
        self._config_before = dict(vars(self._config)) if self._config is not None else {}
        self._flags = bias_flags(self._config, blocks, self.method.writer_biases)

    @contextlib.contextmanager
    def watching(self, index: int, block: nn.Module) -> Iterator[None]:
        """Note each part's tensors as they are (to tell what the cut changed) and the MLP's dense outputs."""
        self._parts = parts = block_parts(block, self._config)
        self._before = {kind: _tensors(owner) for kind, owner in parts.owners.items()}
        self._mlp_outputs = []
        if "attention_residual" not in self.method.STATISTICS or parts.mlp is None:
            yield
            return

        def keep(_: nn.Module, args: Any, output: Tensor) -> None:
            self._mlp_outputs.append(output)

        handle = parts.mlp.register_forward_hook(keep)
        try:
            yield
        finally:
            handle.remove()

    @property
    def reads_dense_inputs(self) -> bool:
        return self.method.reads_dense_inputs

    def follow(
        self,
        index: int,
        block: nn.Module,
        inputs: BlockInputs,
        dense: list[Tensor],
        dense_inputs: list[Tensor] | None = None,
    ) -> list[Tensor]:
        assert self._parts is not None
        parts = self._parts
        changed = frozenset(kind for kind, owner in parts.owners.items() if _tensors(owner) != self._before[kind])
        reads_attention = self.method.reads_attention_residual(changed)
        attention = _attention_targets(dense, self._mlp_outputs) if reads_attention else None
        self._mlp_outputs = []  # (already empty where they made the targets; else let go before the method runs)
        inside = {id(module) for module in block.modules()}
        flags = {flag: [owner for owner in owners if id(owner) in inside] for flag, owners in self._flags.items()}
        added = switch_on_biases(self._config, flags, self._journal)  # after the cut: its widths
        for flag, layers in added.items():
            self._added.setdefault(flag, []).extend(layers)
        originals = _work_on_copies(block, self._journal) if self._journal.enabled else []
        data = RecoveryBlock(
            block, index, (index,), inputs, dense, writers=block_parts(block, self._config).writers, mlp=parts.mlp,
            changed=changed, attention_targets=attention, masks=zero_masks(block), show_progress=self.progress,
            label=f"{self.report.blocks_path}.{index}", ranks=self.ranks, dense_inputs=dense_inputs,
        )  # fmt: skip
        step, outputs = recover_block(self.method, data, lambda done: check_ranks_agree(self.ranks, done))
        _put_back_unchanged(originals)
        self._used.update(flag for flag, layers in added.items() if any_bias_used(layers))
        self.report.steps.append(step)
        self.report.n_tokens = data.n_tokens
        self._mlp_outputs = []
        return outputs

    def finish(self, model: nn.Module) -> None:
        for flag in self._added:  # (each cut block ran with the config of its widths, then the config was put back)
            setattr(self._config, flag, True)
        switch_off(self._added, self._used, self._config, self._config_before)
        self.report.config = config_changes(self._config, self._config_before)
        self.report.seconds = time.perf_counter() - self._start


def _attention_targets(dense: list[Tensor], mlp_outputs: list[Tensor]) -> list[Tensor] | None:
    """The dense residual stream after each batch's attention (block output less the MLP's); None without them.

    Takes the MLP outputs out of ``mlp_outputs``, each as soon as its batch's
    target exists, so the two sets are never whole at once.
    """
    if len(mlp_outputs) != len(dense):
        return None
    return [hidden - mlp_outputs.pop(0) for hidden in dense]


def _tensors(module: nn.Module) -> list[tuple[int, int]]:
    """What identifies ``module``'s tensors as they are: each one's storage and version counter."""
    return [(parameter.data_ptr(), parameter._version) for parameter in module.parameters()]


#: A parameter replaced by a copy: its module, its name there, and the original.
_Original = tuple[nn.Module, str, nn.Parameter]


def _work_on_copies(block: nn.Module, journal: Any) -> list[_Original]:
    """Put a copy of each of ``block``'s parameters in its place, the originals kept in ``journal`` to put back.

    Returns the originals, for :func:`_put_back_unchanged` once the method is done.
    """
    originals = []
    for module in block.modules():
        journal.keep(module)
        for name, parameter in list(module._parameters.items()):
            if parameter is not None:
                module._parameters[name] = nn.Parameter(parameter.detach().clone(), parameter.requires_grad)
                originals.append((module, name, parameter))
    return originals


def _put_back_unchanged(originals: list[_Original]) -> None:
    """Put each original back where its copy still holds the same values, and let the copy go.

    The journal holds the originals until the call returns anyway: a block's
    unchanged parameters (the attention's, where a refit changes the MLP's
    writer only) then cost no second copy for the rest of the pass.
    """
    for module, name, original in originals:
        copy = module._parameters[name]
        if copy is not None and copy.dtype == original.dtype and torch.equal(copy, original):
            module._parameters[name] = original


def planned_rounds(
    model: nn.Module,
    method: str | ShrinkMethod,
    calibration: Any,
    settings: ShrinkOptions,
    method_options: dict[str, Any],
) -> list[ShrinkOptions]:
    """The settings of each of ``settings.steps`` rounds of equal size in units, each a run with its recovery.

    The whole request is checked on ``model`` first (its blocks' weights may
    be on the meta device, as streaming builds it), so no round starts on a
    request a later one would refuse.
    """
    if settings.layers:
        raise ValueError(
            f"steps={settings.steps} splits shares of channels, heads and experts; remove layers in one step"
        )
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    # Every refusal of the whole request, in the engine's words, before the first round changes anything.
    ShrinkJob.prepare(model, method, calibration, dataclasses.replace(settings, steps=1), method_options)
    widths = _widths(model, settings, getattr(model, "config", None))
    rounds = []
    for step in range(1, settings.steps + 1):
        shares = {kind: round_share(n, share, step, settings.steps) for kind, (n, share) in widths.items()}
        if any(shares.values()):
            rounds.append(dataclasses.replace(settings, steps=1, **shares))  # type: ignore[arg-type]
    return rounds


def _widths(model: nn.Module, settings: ShrinkOptions, config: Any) -> dict[str, tuple[int, float]]:
    """Per kind asked for, the units of each block now and the share asked (every block has the same width)."""
    _, blocks = find_blocks(model, settings.blocks)
    widths = {}
    for kind in ("mlp", "heads", "experts"):
        share = getattr(settings, kind)
        if not share:
            continue
        for block in blocks:
            found: Any = (
                find_experts(block) if kind == "experts" else (find_mlp, find_heads)[kind == "heads"](block, config)
            )
            units = getattr(found, "n_experts", None) if kind == "experts" else getattr(found, "n_units", None)
            if isinstance(units, int):
                widths[kind] = (units, share)
                break
        else:  # the first round refuses it, in its own words
            widths[kind] = (1, share)
    return widths


def round_share(n_units: int, share: float, step: int, steps: int) -> float:
    """The share removed in round ``step`` (from 1) of ``steps``, of the units a block has when the round starts."""
    before = _kept(n_units, share, step - 1, steps)
    return (before - _kept(n_units, share, step, steps)) / before


def _kept(n_units: int, share: float, step: int, steps: int) -> int:
    """The units kept after ``step`` of ``steps`` equal rounds that together remove ``round(share * n_units)``."""
    return n_units - round(step * round(share * n_units) / steps)


def combined(reports: list[ShrinkReport]) -> ShrinkReport:
    """One report for the rounds: the first's widths before, the last's kept, every config change, each round's.

    A key's change runs from the value before the first round that changed it
    to the value after the last one (nothing else touches the config between rounds).
    """
    first, last = reports[0], reports[-1]
    combined = ShrinkReport(first.method, first.params_before, last.params_after, first.n_tokens, first.blocks_path)
    for before, after in zip(first.blocks, last.blocks, strict=True):
        combined.blocks.append(dataclasses.replace(before, kept=dict(after.kept), before=dict(before.before)))
    for report in reports:
        for key, (old, new) in report.config.items():
            combined.config[key] = [combined.config.get(key, [old])[0], new]
    combined.config = dict(sorted(combined.config.items()))
    combined.seconds = sum(report.seconds for report in reports)
    combined.rounds = reports
    combined.recovery = last.recovery
    return combined
