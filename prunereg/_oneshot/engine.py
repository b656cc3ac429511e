"""One-shot pruning of a causal language model, block by block, from a little calibration data.

The engine follows the sequential loop of the SparseGPT and Wanda references:
capture the first block's inputs for the calibration set, then for each block
gather the statistics its layers need (forward hooks, once per input group),
prune the layers, and run the block again on its pruned weights to produce the
next block's inputs. Memory: the weights plus one block's calibration
activations. Where the weights live is a :class:`BlockWeights` (in memory here;
streamed from a safetensors folder by :mod:`prunereg._runtime.streamed`).
"""

from __future__ import annotations

import fnmatch
import os
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._core import reparam
from prunereg._distributed.layout import copy_whole
from prunereg._oneshot.contract import (
    SITE,
    CalibratedMethod,
    LayerStatistics,
    PrunedWeight,
    layer_statistics,
    parse_pattern,
)
from prunereg._oneshot.report import LayerReport, OneShotReport, Timings
from prunereg._oneshot.settings import OneShotOptions, check_allocation
from prunereg._progress import progress as progress_bar
from prunereg._runtime.blocks import find_blocks, is_conv1d, prunable_layers, weight_matrix
from prunereg._runtime.calibration import calibration_ids, check_fits_model, load_model, model_folder
from prunereg._runtime.capture import BlockInputs, advance, batches_of, capture_first_block_inputs
from prunereg._runtime.expert_slices import (
    ExpertSlice,
    ExpertSlices,
    expert_slice_names,
    slice_tensor,
    slice_weight,
)
from prunereg._runtime.mode import calibration_mode, check_not_reparametrized, copy_fits, input_device
from prunereg._runtime.options import check_sparsity, with_options_signature
from prunereg._runtime.precision import matmul_precision
from prunereg._runtime.ranks import Ranks, fingerprint, own_batches, together
from prunereg._runtime.recorder import Recorder, gather
from prunereg._runtime.registry import at_site
from prunereg._runtime.sharded import check_sharded_run, sharded_run
from prunereg._runtime.weights import BlockWeights


@with_options_signature(OneShotOptions)
def oneshot(
    model: nn.Module | str | os.PathLike[str],
    method: str | CalibratedMethod,
    *,
    calibration: Any,
    tokenizer: Any = None,
    num_samples: int | None = None,
    seq_len: int | None = None,
    **options: Any,
) -> OneShotReport:
    """Prune a causal language model in place, block by block, with a calibrated method.

    ``method`` is a registered name of kind ``calibrated`` (``"wanda"``,
    ``"sparsegpt"``, ``"magnitude"``), or a configured
    :class:`prunereg.CalibratedMethod` instance.
    ``calibration`` holds token ids: a LongTensor ``[n_samples, seq_len]`` (run in
    batches of ``batch_size`` samples) or an iterable of such batches; or a text,
    a list of texts, a tokenizer's output or a ``datasets.Dataset`` with a
    ``text`` column, tokenised with ``tokenizer`` and cut into ``num_samples`` x
    ``seq_len`` (default 64 x 256) as ``prunereg oneshot`` cuts its text
    (:mod:`prunereg._runtime.calibration`). Token ids the model has no embedding
    for and samples longer than its config allows are refused before anything
    changes. ``model`` may be a Hugging Face folder's path, loaded as
    ``prunereg oneshot`` loads MODEL_DIR (none of its code runs) with its own
    tokenizer for texts; the pruned model is then the report's ``model``.

    The keyword arguments are the run's settings (the table in
    ``docs/llm.md``; :class:`prunereg._oneshot.settings.OneShotOptions` holds
    their defaults and checks); any other keyword is an option of the method,
    passed to its constructor (``blocksize=64``), and one it does not take is a
    TypeError naming those it does.

    ``sparsity`` is the share of each layer's weights pruned (default 0.5, or N/M
    with a ``pattern`` such as ``"2:4"``). ``allocation="owl"`` gives each block
    its own sparsity around that target from its outlier ratio (Yin et al. 2024:
    ``owl_threshold`` is the paper's M, ``owl_lambda`` its lambda).

    Every ``nn.Linear`` (GPT-2: ``Conv1D``) inside the decoder blocks is pruned, or
    those whose full name matches one of the ``layers`` glob patterns, less those
    matching an ``ignore`` glob; embeddings and the output head never. ``blocks``
    names the ``nn.ModuleList`` of decoder blocks for an architecture prunereg
    does not know (see ``prunereg._runtime.blocks``).

    ``permanent=True`` (the default) leaves plain weights with exact zeros, ready
    for ``save_pretrained``; ``permanent=False`` also installs prunereg's
    reparametrization (``weight_orig``, ``weight_mask``), which
    :func:`prunereg.remove` makes permanent later. ``progress`` draws a bar per
    block on stderr (default: when stderr is a terminal or a notebook's output).

    ``matmul_precision`` is torch's float32 matmul precision for the calibration
    forwards only (``"medium"``: bfloat16 products with float32 sums where the
    hardware has them, TF32 on GPUs; ``"highest"``: all float32, bit for bit
    what a plain float32 loop gives). The statistics and the pruning itself always
    run in full float32; ``docs/llm.md`` measures the difference.

    Arguments are checked before anything changes; the model is left in the
    train/eval mode it was in. The report's sparsities are the zeros the
    weights hold after pruning, whatever the method's masks say.

    If pruning fails midway (the method raises, memory runs out, Ctrl-C),
    ``restore_on_error=True`` puts every pruned weight back as it was before
    the call and re-raises: this keeps a copy of each layer's weights in host
    memory from just before it is pruned, up to a copy of all pruned layers at
    the end. ``False`` keeps no copy: the error then says which blocks were
    pruned (in a note on Python 3.11 and later, in a ``RuntimeWarning`` before).
    ``None`` (the default) keeps the copy when it takes at most half the memory
    available now.
    """
    settings, method_options = OneShotOptions.split(options)
    ranks = Ranks.current(settings.data_parallel)
    with together(ranks):
        folder = model_folder(model)
        calibration = calibration_ids(
            calibration, tokenizer=tokenizer, num_samples=num_samples, seq_len=seq_len, folder=folder
        )
        model = load_model(model)
        job = OneShotJob.prepare(
            model, method, calibration=calibration, options=settings, method_options=method_options, ranks=ranks
        )
        restore_on_error = settings.restore_on_error
        if restore_on_error is None:
            restore_on_error = copy_fits(job.weight_bytes())
        with sharded_run(model, job.blocks, ranks) as weights:  # FSDP2: each block gathered whole in turn
            report = job.run(weights, progress=settings.progress, restore_on_error=restore_on_error)
    if folder is not None:
        report.model = model
    return report


@dataclass
class OneShotJob:
    """A checked one-shot request: the method, the blocks and their layers, the calibration batches."""

    model: nn.Module
    method: CalibratedMethod
    method_name: str
    blocks_path: str
    blocks: nn.ModuleList
    layer_names: list[list[str]]
    batches: list[Tensor]
    options: OneShotOptions
    ranks: Ranks | None = None

    @classmethod
    def prepare(
        cls,
        model: nn.Module,
        method: str | CalibratedMethod,
        *,
        calibration: Tensor | Iterable[Tensor],
        options: OneShotOptions,
        method_options: dict[str, Any],
        ranks: Ranks | None = None,
    ) -> OneShotJob:
        """Check every argument and build the method; nothing in ``model`` changes.

        With ``ranks``, every rank's arguments are then checked against the
        others' (one collective): ranks that disagree are refused on every rank.
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        instance, name = build_method(method, options.sparsity, options.pattern, method_options)
        check_allocation(options.allocation, instance.pattern)  # the instance's own pattern
        blocks_path, block_list = find_blocks(model, options.blocks)
        _check_ignore_matches(model, options.ignore)
        layer_names = _select_layers(blocks_path, block_list, options.layers, options.ignore)
        _check_layers(block_list, layer_names, instance)
        check_not_reparametrized(model)
        check_sharded_run(model, "prunereg.oneshot", ranks)
        device = input_device(model)
        batches = list(batches_of(calibration, options.batch_size, device))
        if not batches:
            raise ValueError("calibration holds no token ids")
        check_fits_model(model, batches)
        job = cls(model, instance, name, blocks_path, block_list, layer_names, batches, options, ranks)
        if ranks is not None:
            ranks.agree("prunereg.oneshot", fingerprint(model, instance, options, batches))
        return job

    def weight_bytes(self) -> int:
        """The bytes of the weights this job prunes."""
        return sum(
            _weight(block, name).nbytes
            for block, names in zip(self.blocks, self.layer_names, strict=True)
            for name in names
        )

    def run(self, weights: BlockWeights, *, progress: bool | None = None, restore_on_error: bool) -> OneShotReport:
        """Prune every block in turn, its weights fetched from and handed back to ``weights``.

        On any failure, ``restore_on_error`` puts every pruned layer back as it
        was; without it the error says which blocks were pruned.
        """
        if not restore_on_error:
            touched: list[int] = []
            try:
                return self._run(weights, progress, touched, None)
            except BaseException as error:
                _say_which_blocks_were_pruned(error, self.blocks_path, touched)
                raise
        originals: dict[nn.Module, Tensor] = {}
        layers = list(
            dict.fromkeys(
                _pruned_tensor(block, name) for block, names in zip(self.blocks, self.layer_names, strict=True)
                for name in names
            )
        )  # fmt: skip
        try:
            with reparam.all_or_nothing(layers):  # puts back any reparametrization (permanent=False)
                return self._run(weights, progress, [], originals)
        except BaseException:
            with torch.no_grad():
                for layer, values in originals.items():  # a sharded layer's shards, if its block was given back
                    copy_whole(layer.view if isinstance(layer, ExpertSlice) else weight_matrix(layer), values)
            raise

    def _run(
        self,
        weights: BlockWeights,
        progress: bool | None,
        touched: list[int],
        originals: dict[nn.Module, Tensor] | None,
    ) -> OneShotReport:
        """:meth:`run`'s work: each block index goes to ``touched`` and each layer's weights to ``originals``."""
        start = time.perf_counter()
        report = OneShotReport(
            method=self.method_name,
            sparsity=self.method.sparsity,
            pattern=self.method.pattern,
            allocation=self.options.allocation,
            n_tokens=0,
            permanent=self.options.permanent,
            matmul_precision=self.options.matmul_precision,
        )
        # The forwards run at the requested precision; statistics and pruning step up to "highest" themselves.
        with calibration_mode(self.model), matmul_precision(self.options.matmul_precision):
            sparsities = [self.method.sparsity] * len(self.blocks)
            if self.options.allocation == "owl":
                outlier_start = time.perf_counter()
                report.outlier_ratios = self._outlier_ratios(weights, progress)
                sparsities = _owl_sparsities(report.outlier_ratios, self.method.sparsity, self.options.owl_lambda)
                report.timings.outlier_pass = time.perf_counter() - outlier_start
            # A method that reads no statistics needs no forwards: its layers prune straight from their weights.
            inputs = self._capture(weights, report.timings) if self.method.STATISTICS else None
            if inputs is not None or self.options.allocation == "owl":  # OWL's outlier pass reads the data in any case
                report.n_tokens = sum(batch.numel() for batch in self.batches)
            report.block_sparsities = sparsities
            label = f"{self.method_name} {self.blocks_path}"
            for index in progress_bar(range(len(self.blocks)), label=label, enabled=progress):
                self._prune_block(index, inputs, sparsities[index], weights, report, touched, originals)
        if self.ranks is not None:  # a rank that failed after the last block's statistics fails every rank's run here
            self.ranks.exchange(None)
        report.timings.total = time.perf_counter() - start
        return report

    # -- the passes ------------------------------------------------------------------

    def _capture(self, weights: BlockWeights, timings: Timings) -> BlockInputs:
        """The first block's inputs for this rank's share of the batches (all of them in one process)."""
        start = time.perf_counter()
        with weights.capturing():
            inputs = capture_first_block_inputs(self.model, self.blocks[0], *own_batches(self.ranks, self.batches))
        timings.capture += time.perf_counter() - start
        return inputs

    def _prune_block(
        self,
        index: int,
        inputs: BlockInputs | None,
        sparsity: float,
        weights: BlockWeights,
        report: OneShotReport,
        touched: list[int],
        originals: dict[nn.Module, Tensor] | None,
    ) -> None:
        """Prune block ``index`` from its statistics over ``inputs``, then advance ``inputs`` past it.

        Without ``inputs`` (a method that needs no statistics) each layer is a group of its own.
        """
        timings = report.timings
        block = self.blocks[index]
        loading = time.perf_counter()
        weights.fetch(index, block)
        timings.loading += time.perf_counter() - loading
        slices, layers = _layers(block, self.layer_names[index])
        if inputs is None:
            groups = [([name], LayerStatistics(n_tokens=0)) for name in self.layer_names[index]]
        else:
            with slices:
                groups = self._gather(block, layers, self.method.STATISTICS, inputs, timings)
        uncalled = set(self.layer_names[index]).difference(*(names for names, _ in groups))
        if uncalled:  # an expert of a mixture that no calibration token was routed to, say
            full_names = sorted(f"{self.blocks_path}.{index}.{name}" for name in uncalled)
            warnings.warn(
                f"no calibration input reached {', '.join(full_names)}; left dense", RuntimeWarning, stacklevel=4
            )
            report.unpruned.extend(full_names)
        start = time.perf_counter()
        with matmul_precision("highest"):
            report.layers += self._prune_groups(index, layers, groups, sparsity, touched, originals)
        slices.fold_masks(permanent=self.options.permanent)
        del groups  # the statistics (Hessians) are not needed for the forward below
        timings.pruning += time.perf_counter() - start
        if inputs is not None and index + 1 < len(self.blocks):  # the last block's outputs feed nothing
            self._advance(block, inputs, timings)
        loading = time.perf_counter()
        weights.done(index, block, pruned=True)
        timings.loading += time.perf_counter() - loading

    def _prune_groups(
        self,
        index: int,
        layers: dict[str, nn.Module],
        groups: list[tuple[list[str], LayerStatistics]],
        sparsity: float,
        touched: list[int],
        originals: dict[nn.Module, Tensor] | None,
    ) -> list[LayerReport]:
        """Hand each input group of block ``index`` to the method and write its results into the layers.

        Each layer's weights go to ``originals`` (host memory) first, when given;
        ``index`` goes to ``touched`` with the block's first write.
        """
        prefix = f"{self.blocks_path}.{index}"
        if type(self.method).UPDATES_WEIGHTS:  # on every rank, before any solve: every rank raises alike
            for names, statistics in groups:
                weights = [weight_matrix(layers[name]).detach().float() for name in names]
                _check_finite([f"{prefix}.{name}" for name in names], weights, statistics, self.method_name)
        reports = []
        for (names, _), pruned in zip(groups, self._solve(layers, groups, sparsity), strict=True):
            for name, result in zip(names, pruned, strict=True):
                layer = layers[name]
                if originals is not None:
                    originals[layer] = weight_matrix(layer).detach().to("cpu", copy=True)
                _write_back(layer, result, permanent=self.options.permanent)
                if not touched or touched[-1] != index:
                    touched.append(index)
                written = weight_matrix(layer)  # what the weights hold, whatever the method's mask says
                rows, columns = written.shape
                reached = (written == 0).float().mean().item()
                reports.append(LayerReport(f"{prefix}.{name}", (rows, columns), sparsity, reached))
        return reports

    def _solve(
        self, layers: dict[str, nn.Module], groups: list[tuple[list[str], LayerStatistics]], sparsity: float
    ) -> Iterator[list[PrunedWeight]]:
        """Each input group's results from the method; with ranks, each group solved on one rank and sent to all.

        A group is solved whole wherever it runs, by the same code on the same
        weights and statistics: the results are one process's, bit for bit. A
        method that keeps its kept weights (``UPDATES_WEIGHTS`` false) is
        taken at its mask alone, the weight being this layer's with the pruned
        entries set to zero: so ranks send each other masks, a fifth of the
        bytes of weights and masks, and every rank fills the zeros alike.
        """
        masks_only = not type(self.method).UPDATES_WEIGHTS

        def weights_of(names: list[str]) -> list[torch.Tensor]:
            return [weight_matrix(layers[name]).detach().float() for name in names]

        def solve(position: int) -> list[PrunedWeight]:
            names, statistics = groups[position]
            pruned = self.method.prune_group(weights_of(names), statistics, [sparsity] * len(names))
            if len(pruned) != len(names):
                raise RuntimeError(f"{self.method!r} returned {len(pruned)} results for {len(names)} layers")
            return pruned

        def kept(position: int, masks: Iterable[torch.Tensor]) -> list[PrunedWeight]:
            weights = weights_of(groups[position][0])
            return [
                PrunedWeight(weight.masked_fill(~mask, 0), mask) for weight, mask in zip(weights, masks, strict=True)
            ]

        if self.ranks is None:  # one at a time, written before the next is solved
            if masks_only:
                return (kept(position, (result.mask for result in solve(position))) for position in range(len(groups)))
            return (solve(position) for position in range(len(groups)))
        costs = [solve_cost([weight_matrix(layers[name]) for name in names]) for names, _ in groups]
        if masks_only:
            masks = self.ranks.solve_spread(costs, lambda position: [result.mask for result in solve(position)])
            return iter([kept(position, found) for position, found in enumerate(masks)])
        spread = self.ranks.solve_spread(costs, lambda position: [tuple(result) for result in solve(position)])
        return iter([[PrunedWeight(*result) for result in results] for results in spread])

    def _outlier_ratios(self, weights: BlockWeights, progress: bool | None) -> list[float]:
        """OWL's first pass: each block's outlier ratio, from the dense model's Wanda scores."""
        from prunereg._oneshot.allocation import outlier_ratio

        scratch = Timings()
        inputs = self._capture(weights, scratch)
        ratios = []
        for index in progress_bar(range(len(self.blocks)), label="outlier ratios", enabled=progress):
            block = self.blocks[index]
            weights.fetch(index, block)
            slices, layers = _layers(block, self.layer_names[index])
            with slices:
                groups = self._gather(block, layers, {"input_sq_norms"}, inputs, scratch)
            layer_weights, layer_statistics = [], []
            for names, statistics in groups:
                for name in names:
                    layer_weights.append(weight_matrix(layers[name]).detach().float())
                    layer_statistics.append(statistics)
            ratios.append(float(outlier_ratio(layer_weights, layer_statistics, self.options.owl_threshold)))
            if index + 1 < len(self.blocks):
                self._advance(block, inputs, scratch)
            weights.done(index, block, pruned=False)
        return ratios

    def _gather(
        self,
        block: nn.Module,
        layers: dict[str, nn.Module],
        needs: Iterable[str],
        inputs: BlockInputs,
        timings: Timings,
    ) -> list[tuple[list[str], LayerStatistics]]:
        """Run the calibration batches through ``block`` and return each input group's statistics (all ranks')."""
        start = time.perf_counter()
        recorder = Recorder(at_site(needs, SITE), layers=layers)
        gather(block, inputs, recorder)
        if self.ranks is not None:
            self.ranks.merge(recorder)
        timings.statistics += recorder.seconds
        timings.forward += time.perf_counter() - start - recorder.seconds
        return [(group, layer_statistics(n_tokens, results)) for group, n_tokens, results in recorder.group_results()]

    def _advance(self, block: nn.Module, inputs: BlockInputs, timings: Timings) -> None:
        """Replace ``inputs`` by ``block``'s outputs on them."""
        start = time.perf_counter()
        advance(block, inputs)
        timings.forward += time.perf_counter() - start


# -- checks -------------------------------------------------------------------------------


def build_method(
    method: str | CalibratedMethod, sparsity: float | None, pattern: str | None, options: dict[str, Any]
) -> tuple[CalibratedMethod, str]:
    """The configured method and its name; a one-line TypeError or ValueError for a method or option it refuses."""
    if isinstance(method, CalibratedMethod):
        if options:
            raise TypeError(f"method options {sorted(options)} need a method name, not a configured instance")
        if (sparsity is not None and not _close(sparsity, method.sparsity)) or pattern not in (None, method.pattern):
            raise ValueError(
                f"sparsity and pattern come from the instance {method!r}; leave them out or make them match"
            )
        return method, type(method).__name__
    if not isinstance(method, str):
        raise TypeError(f"method must be a registered name or a CalibratedMethod instance, not {type(method).__name__}")
    from prunereg._plugins.loading import registry

    cls = registry().resolve(method)
    if not (isinstance(cls, type) and issubclass(cls, CalibratedMethod)):
        raise TypeError(
            f"{method!r} is a {getattr(cls, 'PRUNING_TYPE', '?')} method; oneshot needs a calibrated one "
            f"({', '.join(registry().names('calibrated')) or 'none installed'})"
        )
    from prunereg._plugins.registry import untaken_argument

    untaken = untaken_argument(cls, options, leave_out=("sparsity", "pattern"))  # those are oneshot's settings
    if untaken is not None:
        raise TypeError(f"method {method!r} {untaken}")
    if sparsity is None:
        sparsity = 0.5
        if pattern is not None:
            n, m = parse_pattern(pattern)
            sparsity = n / m
    check_sparsity(sparsity)
    return cls(sparsity=sparsity, pattern=pattern, **options), method


def _close(a: float, b: float) -> bool:
    return abs(float(a) - float(b)) < 1e-9


def _check_ignore_matches(model: nn.Module, ignore: Sequence[str]) -> None:
    """Refuse ``ignore`` globs that match no module of ``model`` (a typo would prune what it meant to spare).

    Any module counts, not only prunable ones: ``ignore=["lm_head"]``, as
    llm-compressor users write it, is accepted though the head is never pruned.
    """
    names = [name for name, _ in model.named_modules() if name]
    unused = [p for p in ignore if not any(fnmatch.fnmatchcase(name, p) for name in names)]
    if unused:
        raise ValueError(f"ignore {unused} match no module of the model")


def _select_layers(
    blocks_path: str, blocks: nn.ModuleList, patterns: Sequence[str] | None, ignore: Sequence[str] = ()
) -> list[list[str]]:
    """Per block, the names (relative to the block) of the layers to prune: matching ``patterns``, none of ``ignore``.

    A ``layers`` glob that matches no layer is a ValueError (a typo would otherwise prune what it meant to spare).
    """
    selected = []
    used: set[str] = set()
    for index, block in enumerate(blocks):
        names = []
        for name in [*prunable_layers(block), *expert_slice_names(block)]:
            full_name = f"{blocks_path}.{index}.{name}"
            matching = [p for p in patterns or () if fnmatch.fnmatchcase(full_name, p)]
            ignored = [p for p in ignore if fnmatch.fnmatchcase(full_name, p)]
            used.update(matching)
            if (patterns is None or matching) and not ignored:
                names.append(name)
        selected.append(names)
    unused = [p for p in patterns or () if p not in used]
    if unused:
        raise ValueError(f"layers {unused} match no Linear layer or expert in {blocks_path}.*")
    if not any(selected):
        raise ValueError(f"no Linear layers or experts to prune in {blocks_path}")
    return selected


def _check_layers(blocks: nn.ModuleList, layer_names: list[list[str]], method: CalibratedMethod) -> None:
    for block, names in zip(blocks, layer_names, strict=True):
        for name in names:
            weight = _weight(block, name)
            if not weight.dtype.is_floating_point:
                raise TypeError(f"layer {name} has {weight.dtype} weights; oneshot prunes floating-point ones")
            if method.n_m is not None and weight.shape[1] % method.n_m[1]:
                raise ValueError(
                    f"pattern {method.pattern!r} needs in_features divisible by {method.n_m[1]}, "
                    f"but {name} has {weight.shape[1]}"
                )


def _weight(block: nn.Module, name: str) -> Tensor:
    """The weight of the layer or expert slice ``name`` of ``block``, in Linear's ``[out, in]`` layout."""
    found = slice_weight(block, name)
    return found if found is not None else weight_matrix(block.get_submodule(name))


def _pruned_tensor(block: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module and tensor a pruning of ``name`` reparametrizes: a layer's weight, or a mixture's fused tensor."""
    found = slice_tensor(block, name)
    return (found[0].module, found[1]) if found is not None else (block.get_submodule(name), "weight")


def _layers(block: nn.Module, names: list[str]) -> tuple[ExpertSlices, dict[str, nn.Module]]:
    """The block's expert slices among ``names``, and every layer of ``names`` by name (the slices' included)."""
    slices = ExpertSlices(block, names)
    return slices, {name: slices.layers[name] if name in slices.layers else block.get_submodule(name) for name in names}


def _check_finite(names: list[str], weights: list[Tensor], statistics: LayerStatistics, method: str) -> None:
    """Refuse NaN or inf before a method that updates weights spreads it over every weight it keeps.

    ``names``: the group's layers, named in the one-line ValueError.
    """
    for name, weight in zip(names, weights, strict=True):
        if not bool(torch.isfinite(weight).all()):
            raise ValueError(
                f"{name}.weight is not finite (it holds NaN or inf), and {method} spreads each pruned weight's "
                "error over the weights it keeps; repair those weights, or prune with wanda or magnitude, "
                "which prune NaN first"
            )
    for field in ("input_sq_norms", "hessian"):
        value = getattr(statistics, field)
        if value is not None and not bool(torch.isfinite(value).all()):
            raise ValueError(
                f"the calibration inputs of {', '.join(names)} are not finite (NaN or inf): a weight before them "
                "is not finite or the model's dtype overflowed; repair the weights, or load the model in float32"
            )


def _say_which_blocks_were_pruned(error: BaseException, blocks_path: str, touched: list[int]) -> None:
    """Tell the caller of a run that failed without restoring which blocks it pruned before the error."""
    if not touched:
        return
    blocks = f"blocks {touched[0]} to {touched[-1]}" if len(touched) > 1 else f"block {touched[0]}"
    message = (
        f"prunereg.oneshot stopped after pruning {blocks} of {blocks_path}, the last perhaps only in part "
        "(restore_on_error=False): the model is half pruned"
    )
    add_note = getattr(error, "add_note", None)
    if callable(add_note):
        add_note(message)
    else:  # Python 3.10
        warnings.warn(message, RuntimeWarning, stacklevel=4)


# -- doing --------------------------------------------------------------------------------


def solve_cost(weights: Sequence[Tensor]) -> float:
    """A group's solve cost, to share the solves among ranks: ``rows * in**2 + in**3`` (SparseGPT's sweep and inverse).

    Only the ranks' balance depends on it, never a result.
    """
    columns = weights[0].shape[1]
    return float(sum(weight.shape[0] for weight in weights) * columns**2 + columns**3)


def _owl_sparsities(ratios: list[float], target: float, lam: float) -> list[float]:
    from prunereg._oneshot.allocation import owl_sparsities

    return [float(s) for s in owl_sparsities(ratios, target, lam)]


def _write_back(layer: nn.Module, result: PrunedWeight, *, permanent: bool) -> None:
    """Put the pruned weight into the layer's own Parameter, in its layout and dtype."""
    mask = result.mask.T if is_conv1d(layer) else result.mask
    with torch.no_grad():
        weight_matrix(layer).copy_(result.weight)
    if not permanent:
        from prunereg._core.custom import CustomFromMask

        CustomFromMask.apply(layer, "weight", mask)
