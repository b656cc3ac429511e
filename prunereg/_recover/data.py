"""What a recovery method is handed: one decoder block with its calibration data, or the whole model.

A block's data (:class:`RecoveryBlock`) is the block as the model being
recovered (the *student*) has it, its calibration inputs along the student's
own trajectory (every earlier block already recovered), and the *targets*: what
the dense model (the *teacher*) produced at the same place on its own
trajectory, after the teacher's block and any blocks removed right after it.
On request it gathers the float64 least-squares statistics of the block's
writer projections (:meth:`RecoveryBlock.normal_equations`), computed on the
block's current weights, so a method can refit one projection, then ask again:
the runtime's ``least_squares`` statistic, folded by its one recorder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from prunereg._progress import progress as progress_bar
from prunereg._recover.runtime import (
    BlockInputs,
    Called,
    LeastSquares,
    NormalEquations,
    Observation,
    Ranks,
    Recorder,
    call_block,
    gather,
    input_device,
)

T = TypeVar("T")

#: What :meth:`RecoveryBlock.normal_equations` fits: the input side of each fit and what it must produce.
FITS = {
    "mlp": "the MLP's writer projection (down_proj): its inputs -> what it must add for the block to give the target",
    "attention": "the attention's writer (o_proj): its inputs -> the dense residual after attention less the input",
    "mlp_output": "the MLP's output -> the target less the block's residual after attention (ReplaceMe's map)",
}


#: The share of exact zeros from which a weight counts as pruned. Dense checkpoints hold a few by accident
#: (SmolLM2-135M, dequantised from 4 bits: 0.02-0.05 % of each block weight); pruning leaves far more.
PRUNED_ZEROS_SHARE = 0.01


def zero_masks(module: nn.Module, share: float = PRUNED_ZEROS_SHARE) -> dict[str, Tensor]:
    """Per pruned parameter of ``module`` (two dims or more, ``share`` of it exact zeros or more): where it is non-zero.

    These are the entries a pruned (masked) model keeps; recovery changes only
    them, so that every zero stays zero. A weight with fewer zeros is a dense
    one whose zeros are chance values, which recovery may change like any other
    (``share=0``: every weight with a zero counts as pruned).
    """
    masks = {}
    for name, parameter in module.named_parameters():
        if parameter.dim() >= 2 and parameter.dtype.is_floating_point:
            kept = parameter.detach() != 0
            zeros = kept.numel() - int(kept.sum())
            if zeros and zeros >= share * kept.numel():
                masks[name] = kept
    return masks


def apply_zero_masks(module: nn.Module, masks: dict[str, Tensor]) -> None:
    """Zero every entry of ``module``'s parameters that ``masks`` says is pruned."""
    with torch.no_grad():
        for name, kept in masks.items():
            module.get_parameter(name).mul_(kept.to(module.get_parameter(name).device))


def _cast(value: Any, dtype: torch.dtype | None) -> Any:
    """``value`` with every floating-point tensor in it (tuples, lists, dicts) as ``dtype``."""
    if dtype is None:
        return value
    if isinstance(value, Tensor):
        return value.to(dtype) if value.dtype.is_floating_point else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(item, dtype) for item in value)
    if isinstance(value, dict):
        return {key: _cast(item, dtype) for key, item in value.items()}
    return value


#: What identifies a block's weights as they are: each tensor's storage and version counter.
WeightsKey = tuple[tuple[int, int], ...]
#: A pass over the calibration set: the loss and each batch's output.
_Evaluation = tuple[float, list[Tensor]]


def _rows(tensor: Tensor) -> Tensor:
    return tensor.reshape(-1, tensor.shape[-1])


class RecoveryBlock:
    """One decoder block of the model being recovered, with its calibration data and the dense model's targets.

    - ``module``: the block itself; a method changes only its existing
      parameters' values (shapes, dtypes and devices kept), and on a masked
      model only the entries ``masks`` keeps;
    - ``index``: its index in the model; ``teacher_indices``: the teacher's
      blocks it stands for, its own first, then those removed right after it
      (the targets are the teacher's hidden states after the last of them);
      ``changed``: the parts (``"attention"``, ``"mlp"``) whose tensors are
      no longer the teacher block's (narrowed, pruned, recovered before);
    - :meth:`forward` runs it on calibration batch ``b`` (the student's
      trajectory), :meth:`target` is the dense model's output there; with
      ``dense_inputs=True`` it runs on the hidden states the dense model's
      block read to give that target (:meth:`dense_input`: kept by the
      engine for a method whose :attr:`~prunereg.RecoveryMethod.reads_dense_inputs`
      says so; where the targets came from the student's own inputs, those);
      :meth:`loss` the mean squared error between the two over the calibration set;
    - :meth:`writer` the projections whose outputs the block adds to its
      residual stream as they are (``"attention"``: ``o_proj``, ``"mlp"``:
      ``down_proj``), :attr:`mlp` the MLP module (a mixture of experts too);
      :meth:`normal_equations` the float64 statistics to refit them;
    - ``seed`` for random draws; :meth:`progress` a bar that follows the run's ``progress`` setting;
    - ``ranks``: under torch.distributed, the ranks that each hold a contiguous
      share of the calibration batches (``inputs.first`` the index of this
      rank's first): :meth:`loss`, :meth:`evaluate`'s loss, :meth:`n_tokens`
      and :meth:`normal_equations` are then over every rank's batches, the same
      bits as one process, and the checks on the first batch are rank 0's.
      Only :meth:`forward`, :meth:`target` and :attr:`n_batches` are this rank's own;
      :meth:`solve_spread` shares a method's solves among the ranks.
    """

    def __init__(
        self,
        module: nn.Module,
        index: int,
        teacher_indices: tuple[int, ...],
        inputs: BlockInputs,
        targets: list[Tensor],
        *,
        writers: dict[str, nn.Module],
        mlp: nn.Module | None,
        changed: frozenset[str] = frozenset(),
        attention_targets: list[Tensor] | None = None,
        masks: dict[str, Tensor] | None = None,
        seed: int = 0,
        show_progress: bool | None = False,
        label: str = "",
        ranks: Ranks | None = None,
        dense_inputs: list[Tensor] | None = None,
    ) -> None:
        if len(inputs) != len(targets) or not targets:
            raise ValueError(f"a block needs one target per calibration batch: {len(inputs)} and {len(targets)}")
        if dense_inputs is not None and len(dense_inputs) != len(targets):
            raise ValueError(
                f"a block needs one dense input per calibration batch: {len(dense_inputs)} and {len(targets)}"
            )
        self.module = module
        self.index = index
        self.teacher_indices = teacher_indices
        self.masks: dict[str, Tensor] = dict(masks or {})
        self.changed = changed
        self.seed = seed
        self.label = label
        self.ranks = ranks
        self._inputs = inputs
        self._targets = targets
        self._dense_inputs = dense_inputs
        self._attention_targets = attention_targets
        self._candidates = writers
        self._checked: dict[str, nn.Module | None] = {}
        self._mlp = mlp
        self._mlp_adds: bool | None = None
        self._show_progress = show_progress
        self._latest: tuple[WeightsKey, _Evaluation] | None = None
        self._original_loss: float | None = None
        self._replay: _Replay | None = None
        self._original_key = self.weights_key()

    # -- the data ------------------------------------------------------------------------

    @property
    def n_batches(self) -> int:
        return len(self._targets)

    @property
    def n_tokens(self) -> int:
        """The calibration tokens of every rank's batches."""
        mine = sum(_rows(target).shape[0] for target in self._targets)
        return mine if self.ranks is None else sum(self.ranks.exchange(mine))

    def solve_spread(self, costs: Sequence[float], solve: Callable[[int], T]) -> list[T]:
        """``solve(i)`` for each of the items that ``costs`` weigh, in order; under ranks each solved on one rank.

        The ranks share the items by cost and send each result to every rank,
        so ``solve`` must give tensors and numbers (in tuples, lists, dicts)
        that depend on its item alone: every rank then writes the solver's
        bits, one process's. In one process each item is solved here, in order.
        """
        if self.ranks is None:
            return [solve(index) for index in range(len(costs))]
        return self.ranks.solve_spread(costs, solve)

    @property
    def removed_after(self) -> int:
        """How many of the teacher's blocks right after this one the model no longer has."""
        return len(self.teacher_indices) - 1

    def forward(self, batch: int, *, dtype: torch.dtype | None = None, dense_inputs: bool = False) -> Tensor:
        """The block's output on calibration batch ``batch`` (its floating inputs as ``dtype`` if given).

        ``dense_inputs``: on :meth:`dense_input` (what the dense block read to give
        the target) rather than on the student's trajectory; the other arguments
        (position embeddings, masks) are the batch's own either way. Runs in the
        caller's grad mode: a training method calls it under ``torch.enable_grad()``.
        """
        inputs = self._inputs
        hidden = self.dense_input(batch) if dense_inputs else inputs.hidden[batch]
        if dtype is None and hidden is inputs.hidden[batch]:
            return call_block(self.module, inputs, batch)
        one = BlockInputs(
            [hidden if dtype is None else hidden.to(dtype)],
            [_cast(inputs.args[batch], dtype)],
            [_cast(inputs.kwargs[batch], dtype)],
        )
        return call_block(self.module, one, 0)

    def block_input(self, batch: int) -> Tensor:
        """The hidden states the block reads on calibration batch ``batch`` (the student's trajectory)."""
        return self._inputs.hidden[batch]

    def dense_input(self, batch: int) -> Tensor:
        """The hidden states the dense model's block read to give :meth:`target` on batch ``batch``.

        Those the engine kept for a method that :attr:`~prunereg.RecoveryMethod.reads_dense_inputs`
        (on the student's inputs' device and in their dtype); where it kept none
        (the targets came from the student's own inputs, or the method did not
        ask), the student's.
        """
        own = self._inputs.hidden[batch]
        if self._dense_inputs is None:
            return own
        return self._dense_inputs[batch].to(device=own.device, dtype=own.dtype)

    def output_of(self, module: nn.Module, batch: int) -> Tensor:
        """What ``module`` (a module inside the block) outputs when the block runs on calibration batch ``batch``."""
        seen: list[Tensor] = []

        def keep(_: nn.Module, args: Any, output: Tensor) -> None:
            seen.append(output)

        with torch.no_grad(), _hooked(module, keep):
            self.forward(batch)
        if not seen:
            raise ValueError(f"{type(module).__name__} did not run in block {self.index}'s forward")
        return seen[0]

    def target(self, batch: int) -> Tensor:
        """The dense model's hidden states that the block's output should match on batch ``batch``."""
        return self._targets[batch]

    def loss(self) -> float:
        """The mean squared error of the block's output against the targets over the calibration set."""
        return self.evaluate()[0]

    def evaluate(self) -> _Evaluation:
        """:meth:`loss`, and each batch's output (they feed the next block; the block's own, which an
        evaluation on other weights may overwrite with its own: copy them to keep them).

        A pass over the calibration set on the block's current weights runs
        once: a later call, or the engine, reuses it while the weights are
        unchanged. After :meth:`normal_equations` for a projection whose output
        the block adds as it is, a method that changed only that projection
        costs no pass: the outputs are the statistics' pass's, plus the
        projection's change on its inputs (equal to a forward up to float
        rounding), made in their place.
        """
        key = self.weights_key()
        found = self.evaluation(key)
        if found is not None:
            return found
        latest, self._latest = self._latest, None  # the outputs of other weights go before new ones are made
        replay, self._replay = self._replay, None  # spent either way: it adds to the outputs it was made with
        if replay is not None and latest is not None and latest[0] == replay.key:
            found = replay.evaluate(key, latest[1][1], self._targets, self.ranks)
            if found is not None:
                self._keep(key, found)
                return found
        del latest, replay
        return self._pass()

    def weights_key(self) -> WeightsKey:
        """What identifies the block's weights as they are now (each tensor's storage and version counter)."""
        return tuple((p.data_ptr(), p._version) for p in self.module.parameters())

    def evaluation(self, key: WeightsKey) -> _Evaluation | None:
        """The loss and outputs of the latest pass, if it was made on the weights ``key`` identifies.

        Only the latest pass's outputs are kept (one set of hidden states), and
        the loss of the first pass on the weights the block came with (:meth:`original_loss`).
        """
        if self._latest is None or self._latest[0] != key:
            return None
        return self._latest[1]

    def original_loss(self) -> float | None:
        """The loss on the weights the block came with, where a pass on them was made (None where none was)."""
        return self._original_loss

    def _pass(self, recorder: Recorder | None = None) -> _Evaluation:
        """Run every calibration batch through the block, under ``recorder`` if given (its statistics folded in).

        Keeps the loss and outputs (:meth:`evaluation`) under the weights' key.
        """
        with torch.no_grad():
            if recorder is None:
                outputs = [self.forward(batch) for batch in range(self.n_batches)]
            else:
                outputs = gather(self.module, self._inputs, recorder, keep_outputs=True)
        result = (_loss_of(outputs, self._targets, self.ranks), outputs)
        self._keep(self.weights_key(), result)
        return result

    def _keep(self, key: WeightsKey, result: _Evaluation) -> None:
        if key == self._original_key and self._original_loss is None:
            self._original_loss = result[0]
        self._latest = (key, result)

    def progress(self, items: Iterable[T], *, label: str, total: int | None = None) -> Iterator[T]:
        """``items``, with a progress bar when the run shows one."""
        return progress_bar(items, label=f"{self.label} {label}".strip(), total=total, enabled=self._show_progress)

    def keep_zeros(self) -> None:
        """Zero again every entry that ``masks`` says is pruned (after a training step, say)."""
        apply_zero_masks(self.module, self.masks)

    # -- the projections -----------------------------------------------------------------

    @property
    def mlp(self) -> nn.Module | None:
        """The block's MLP (or mixture of experts), when its output is added to the residual stream as it is."""
        if self._mlp is None:
            return None
        if self._mlp_adds is None:
            self._mlp_adds = self._rank_zero_says(self._adds_output(self._mlp))
        return self._mlp if self._mlp_adds else None

    def writer(self, kind: str) -> nn.Module | None:
        """The ``nn.Linear`` that writes ``kind``'s (``"attention"``, ``"mlp"``) output into the residual stream.

        None where the block has none, or where its output does not reach the
        residual stream as it is (a norm after it, say): a refit of it would not
        be a least-squares fit of the block's output. Checked on the first
        calibration batch, once.
        """
        if kind not in ("attention", "mlp"):
            raise ValueError(f"kind must be 'attention' or 'mlp', not {kind!r}")
        if kind not in self._checked:
            found = self._rank_zero_says(self._checked_writer(kind) is not None)
            self._checked[kind] = self._candidates[kind] if found else None
        return self._checked[kind]

    def _rank_zero_says(self, here: bool) -> bool:
        """What rank 0 (which holds the first calibration batch) found on it; ``here`` itself without ranks."""
        return here if self.ranks is None else bool(self.ranks.exchange(here)[0])

    def _checked_writer(self, kind: str) -> nn.Module | None:
        writer = self._candidates.get(kind)
        if not isinstance(writer, nn.Linear):
            return None
        if kind == "mlp":
            return writer if self._adds_output(writer) else None
        if self.mlp is None or self._attention_targets is None:
            return None
        residual, _, written = self._residual_after_attention(0, writer)
        return writer if _close(residual - self._inputs.hidden[0], written, residual) else None

    def _adds_output(self, module: nn.Module) -> bool:
        """Whether the block's output moves by exactly ``module``'s output when that output doubles (batch 0)."""
        captured: list[Tensor] = []

        def double(_: nn.Module, args: Any, output: Tensor) -> Tensor:
            captured.append(output)
            return output * 2

        with torch.no_grad():
            plain = self.forward(0)
            with _hooked(module, double):
                doubled = self.forward(0)
        return len(captured) == 1 and _close(doubled - plain, captured[0], plain)

    def _residual_after_attention(self, batch: int, writer: nn.Module) -> tuple[Tensor, Tensor, Tensor]:
        """The residual stream after attention (block output less the MLP's), the writer's inputs and outputs."""
        seen: dict[str, Tensor] = {}

        def mlp_output(_: nn.Module, args: Any, output: Tensor) -> None:
            seen["mlp"] = output

        def writer_io(_: nn.Module, args: Any, output: Tensor) -> None:
            seen["input"], seen["output"] = args[0], output

        assert self._mlp is not None
        with torch.no_grad(), _hooked(self._mlp, mlp_output), _hooked(writer, writer_io):
            output = self.forward(batch)
        return output - seen["mlp"], seen["input"], seen["output"]

    # -- the statistics ------------------------------------------------------------------

    def normal_equations(self, fit: str) -> NormalEquations:
        """The float64 statistics of one least-squares fit over the calibration set, on the current weights.

        ``fit`` is one of :data:`FITS`: ``"mlp"`` (the MLP writer's inputs to
        what it must add so that the block gives the target), ``"attention"``
        (``o_proj``'s inputs to the dense model's residual stream after its
        attention, less the block's input) or ``"mlp_output"`` (the MLP's
        output to the target less the residual stream after attention). A
        ``ValueError`` where the block has no such projection (:meth:`writer`).
        One pass over the calibration set, which also serves as :meth:`evaluate`
        while the weights stay as they are.
        """
        if fit not in FITS:
            raise ValueError(f"fit must be one of {', '.join(FITS)}, not {fit!r}")
        kind = "attention" if fit == "attention" else "mlp"
        module = self.writer(kind) if fit != "mlp_output" else self.mlp
        if module is None:
            raise ValueError(f"block {self.index} has no {kind} writer whose output the block adds as it is")
        replay = _Replay(self.module, module) if fit == "mlp" and _plain_linear(module) else None

        def drawn(observation: Observation) -> tuple[Tensor, Tensor]:
            assert observation.inputs is not None and observation.outputs is not None
            batch = observation.batch - self._inputs.first  # this rank's own list holds its batches only
            if fit == "attention":
                assert self._attention_targets is not None
                return observation.inputs, self._attention_targets[batch] - self._inputs.hidden[batch]
            # what the module must give for the block's output to be the target: the rest stays
            assert observation.block_outputs is not None
            rest = observation.block_outputs - observation.outputs
            if replay is not None:
                replay.add(observation.inputs)
            inputs = observation.outputs if fit == "mlp_output" else observation.inputs
            return inputs, self._targets[batch] - rest

        recorder = Recorder(
            call_statistics={"least_squares": lambda: LeastSquares(drawn)}, calls={"fit": Called(module)}
        )
        self._replay = None  # the one kept is of weights about to change
        self._latest = None  # so are the outputs: let go before this pass makes its own
        self._pass(recorder)
        self._replay = replay
        tally = recorder.called["fit"]
        if self.ranks is not None:
            tally = self.ranks.merged(tally)
        equations = tally.results()["least_squares"]
        if equations is None:
            raise ValueError(f"{type(module).__name__} did not run in block {self.index}'s forward")
        return equations


def _loss_of(outputs: list[Tensor], targets: list[Tensor], ranks: Ranks | None = None) -> float:
    """The mean squared error of ``outputs`` against ``targets``, summed in float64, batch by batch in order.

    With ``ranks``, over every rank's batches: the per-batch sums are gathered and added in batch order.
    """
    sums = [float((output.double() - target.double()).square().sum()) for output, target in zip(outputs, targets)]
    count = sum(output.numel() for output in outputs)
    if ranks is not None:
        everyone = ranks.exchange((sums, count))
        sums = [each for rank_sums, _ in everyone for each in rank_sums]
        count = sum(rank_count for _, rank_count in everyone)
    return sum(sums) / max(count, 1)


class _Replay:
    """A block's outputs as a linear ``writer`` changes, without running the block.

    Kept by the statistics' pass of a writer whose output the block adds as
    it is: the writer's inputs per batch and its weights then. The outputs
    on new writer weights are that pass's outputs plus the writer's change
    on its inputs, ``x (W1 - W0)^T + (b1 - b0)``, added in their place. Valid
    while every other parameter of the block is as it was then.
    """

    def __init__(self, block: nn.Module, writer: nn.Linear) -> None:
        self.writer = writer
        own = {id(parameter) for parameter in writer.parameters(recurse=False)}
        self.others = [i for i, parameter in enumerate(block.parameters()) if id(parameter) not in own]
        self.key = tuple((p.data_ptr(), p._version) for p in block.parameters())
        self.work = torch.promote_types(writer.weight.dtype, torch.float32)  # a half-precision change, in float32
        self.weight = writer.weight.detach().clone()
        self.bias = None if writer.bias is None else writer.bias.detach().to(self.work, copy=True)
        self.inputs: list[Tensor] = []

    def add(self, inputs: Tensor) -> None:
        self.inputs.append(inputs)

    def evaluate(
        self, key: WeightsKey, outputs: list[Tensor], targets: list[Tensor], ranks: Ranks | None
    ) -> _Evaluation | None:
        """The loss and outputs on the block's weights ``key``, made in ``outputs``' place (the outputs of the pass
        that made this replay); None where more than the writer changed."""
        if len(key) != len(self.key) or any(key[i] != self.key[i] for i in self.others):
            return None
        work = self.work
        with torch.no_grad():
            weight = self.writer.weight.to(work) - self.weight.to(work)
            bias = None if self.writer.bias is None or self.bias is None else self.writer.bias.to(work) - self.bias
            for x, output in zip(self.inputs, outputs, strict=True):
                output.add_(F.linear(x.to(work), weight, bias))
        return _loss_of(outputs, targets, ranks), outputs


def _plain_linear(module: nn.Module) -> TypeGuard[nn.Linear]:
    """Whether ``module`` computes ``x W^T + b`` and nothing else: an ``nn.Linear`` with no hooks of its own."""
    return (
        isinstance(module, nn.Linear)
        and type(module).forward is nn.Linear.forward
        and not (module._forward_hooks or module._forward_pre_hooks)
    )


def _close(measured: Tensor, expected: Tensor, around: Tensor) -> bool:
    """Whether ``measured`` is ``expected`` up to the rounding of the block's dtype.

    ``measured`` is a difference of activations of the size of ``around`` (the
    residual stream), so their rounding counts too: a writer's output can be
    small beside the residual stream it is added to.
    """
    tolerance = 1e-4 if measured.dtype in (torch.float32, torch.float64) else 3e-2
    difference = float((measured.double() - expected.double()).norm())
    allowed = tolerance * float(expected.double().norm()) + tolerance / 10 * float(around.double().norm())
    return difference <= allowed + 1e-12


@contextlib.contextmanager
def _hooked(module: nn.Module, hook: Callable[..., Any]) -> Iterator[None]:
    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@dataclass
class RecoveryModel:
    """The whole model for a method that recovers it at once (``SCOPE = "model"``: logit distillation).

    ``student`` is the model being recovered, ``teacher`` the dense one;
    ``batches`` the calibration token ids, ``[batch, seq_len]`` each. A method
    changes only the student's existing parameters' values, never its input
    embeddings or output head (:attr:`trainable` lists those it may change),
    and on a masked model only the entries ``masks`` keeps (by parameter name).
    """

    student: nn.Module
    teacher: nn.Module
    batches: list[Tensor]
    masks: dict[str, Tensor]
    seed: int = 0
    show_progress: bool | None = False

    @property
    def n_tokens(self) -> int:
        return sum(batch.numel() for batch in self.batches)

    def trainable(self) -> dict[str, nn.Parameter]:
        """The student's parameters a method may change: all but the input embeddings and the output head."""
        frozen = set()
        for getter in ("get_input_embeddings", "get_output_embeddings"):
            found = getattr(self.student, getter, lambda: None)()
            if isinstance(found, nn.Module):
                frozen |= {id(parameter) for parameter in found.parameters()}
        return {name: parameter for name, parameter in self.student.named_parameters() if id(parameter) not in frozen}

    def loss(self) -> float:
        """The mean over the calibration tokens of KL(teacher || student) of the next-token distributions."""
        total, count = 0.0, 0
        with torch.no_grad():
            for batch in self.batches:
                for row in batch.split(1):  # one sample's logits at a time: [seq_len, vocabulary] each
                    log_p = torch.log_softmax(self.logits(row, teacher=True).double(), dim=-1)
                    log_q = torch.log_softmax(self.logits(row).double(), dim=-1)
                    total += float((log_p.exp() * (log_p - log_q)).sum())
                    count += row.numel()
        return total / max(count, 1)

    def logits(self, ids: Tensor, *, teacher: bool = False) -> Tensor:
        """The student's (or the teacher's) logits for token ids ``ids``, ``[..., vocabulary]``, without a cache.

        Runs in the caller's grad mode; the teacher's ids go to its own device.
        """
        model = self.teacher if teacher else self.student
        options = {"use_cache": False} if hasattr(getattr(model, "config", None), "use_cache") else {}
        output = model(ids.to(input_device(model)), **options)
        if isinstance(output, Tensor):
            return output
        return output.logits if hasattr(output, "logits") else output[0]

    def progress(self, items: Iterable[T], *, label: str, total: int | None = None) -> Iterator[T]:
        """``items``, with a progress bar when the run shows one."""
        return progress_bar(items, label=label, total=total, enabled=self.show_progress)

    def keep_zeros(self) -> None:
        """Zero again every entry that ``masks`` says is pruned."""
        apply_zero_masks(self.student, self.masks)
