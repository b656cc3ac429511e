"""The contract for calibrated methods: pruning that looks at calibration activations.

A calibrated method (Wanda, SparseGPT, a magnitude baseline) prunes the Linear
layers of one decoder block at a time. The one-shot engine runs the calibration
set through the block, gathers the :class:`LayerStatistics` the method asks for
(``STATISTICS``: registered statistics observed at ``layer_input``, see
:mod:`prunereg._runtime.statistics`) for each group of layers that read the same
input (q/k/v, gate/up), and hands each group to :meth:`CalibratedMethod.prune_group`, which
returns every layer's new weight and mask. A group is pruned together so that
shared work (one Hessian inverse, one sweep over the stacked rows) is done once.
A method that asks for no statistics gets no forwards at all: each layer is a
group of its own, with ``n_tokens`` 0.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch

from prunereg._core.method import BasePruningMethod
from prunereg._plugins.isolation import guard_plugin_methods
from prunereg._runtime.options import check_sparsity
from prunereg._runtime.registry import check_statistics
from prunereg._runtime.statistics import ReadByName

KIND = "calibrated"

#: Where the statistics of a calibrated method are observed: the input its group of layers reads.
SITE = "layer_input"
#: The statistics :class:`LayerStatistics` holds in fields of their own; any other comes in ``extra``.
FIELDS = ("input_sq_norms", "hessian")


@dataclass(frozen=True)
class LayerStatistics(ReadByName):
    """What the calibration activations say about the input shared by one group of Linear layers.

    ``input_sq_norms[j]`` is the sum over tokens of ``x_j ** 2`` (Wanda scores with its
    square root); ``hessian`` is ``(2 / n_tokens) * sum over tokens of x x^T`` (SparseGPT's
    layer Hessian). Both are float32; a statistic the method did not ask for may be None.
    Any other statistic the method asked for (one a plugin registered) is in
    ``extra`` by name: ``statistics["name"]``.
    """

    n_tokens: int
    input_sq_norms: torch.Tensor | None = None
    hessian: torch.Tensor | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


def layer_statistics(n_tokens: int, results: Mapping[str, Any]) -> LayerStatistics:
    """The statistics a recorder gathered for one group (results by name), as a method reads them."""
    extra = {name: value for name, value in results.items() if name not in FIELDS}
    return LayerStatistics(n_tokens, results.get("input_sq_norms"), results.get("hessian"), extra)


class PrunedWeight(NamedTuple):
    """One layer's result: its new dense weight ``[out, in]`` (pruned entries exactly zero) and bool mask."""

    weight: torch.Tensor
    mask: torch.Tensor


def parse_pattern(pattern: str) -> tuple[int, int]:
    """``"N:M"`` as ``(N, M)``: N zeros in every M consecutive inputs of a row, with ``0 < N < M``."""
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a string like '2:4', not {type(pattern).__name__}")
    n_text, sep, m_text = (part.strip() for part in pattern.partition(":"))
    # digits 0-9 only: str.isdigit() also takes '²', which int() refuses, and int() reads '٢' as 2
    if not (sep and _ascii_digits(n_text) and _ascii_digits(m_text)):
        raise ValueError(f"pattern must look like 'N:M' (e.g. '2:4'), not {pattern!r}")
    n, m = int(n_text), int(m_text)
    if not 0 < n < m:
        raise ValueError(f"pattern {pattern!r} needs 0 < N < M")
    return n, m


def _ascii_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


class CalibratedMethod(ABC):
    """A pruning method that prunes a group of Linear layers from their calibration statistics.

    ``sparsity`` is the share of each layer's weights to prune; ``pattern`` (``"N:M"``)
    instead prunes N of every M consecutive inputs in each row, and then ``sparsity``,
    if given, must equal N/M. Subclasses add their own options as keyword arguments
    with defaults, set ``STATISTICS`` to what the engine must gather, and implement
    :meth:`prune_group`. A method that changes kept weights (SparseGPT's update)
    sets ``UPDATES_WEIGHTS``; one that does not is taken at its masks alone (the
    engine zeroes the pruned weights itself: the same bits on one process and on
    any number of ranks).
    """

    PRUNING_TYPE: ClassVar[str] = KIND
    STATISTICS: ClassVar[frozenset[str]] = frozenset()
    UPDATES_WEIGHTS: ClassVar[bool] = False

    def __init__(self, sparsity: float = 0.5, pattern: str | None = None) -> None:
        self.sparsity = check_sparsity(sparsity)
        self.pattern = pattern
        self.n_m: tuple[int, int] | None = None
        if pattern is not None:
            n, m = parse_pattern(pattern)
            if not math.isclose(self.sparsity, n / m):
                raise ValueError(f"pattern {pattern!r} prunes {n / m:g} of the weights, but sparsity is {sparsity!r}")
            self.n_m = (n, m)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        check_statistics(cls.__name__, cls.STATISTICS, sites=(SITE,))
        # A third-party method runs as plugin code: sys.exit() in it is an error, its prints go to stderr.
        guard_plugin_methods(cls, ("__init__", "prune_group"))

    def __repr__(self) -> str:
        if self.pattern is None:
            return f"{type(self).__name__}(sparsity={self.sparsity:g})"
        return f"{type(self).__name__}(pattern={self.pattern!r})"

    @abstractmethod
    def prune_group(
        self,
        weights: Sequence[torch.Tensor],
        statistics: LayerStatistics,
        sparsities: Sequence[float],
    ) -> list[PrunedWeight]:
        """Prune Linear weights (``[out_i, in]``, float32, one device) that read the same input.

        ``sparsities[i]`` is layer i's target (OWL gives per-block values; the pattern, if
        any, overrides it). Each layer keeps its own selection; work the layers share is
        done once for the group. The inputs are left untouched. The result must depend on
        the arguments alone: under ``torch.distributed`` each group is solved on one rank
        only, and the other ranks take its result.
        """

    @classmethod
    def runs_without_calibration(cls) -> bool:
        """Whether this method prunes a weight from its values alone: it asks for no statistics, updates no weights.

        Such a method (``magnitude``) also prunes model files, ``prunereg prune``
        and :func:`prunereg.prune_file`, through :meth:`as_mask_method`.
        """
        return not cls.STATISTICS and not cls.UPDATES_WEIGHTS

    def as_mask_method(self) -> BasePruningMethod:
        """This method as a mask method pruning one tensor on its own, for model files without a model.

        The tensor is pruned as a matrix ``[shape[0], rest]`` in float32 by
        :meth:`prune_group` with empty statistics, to this method's own
        sparsity (or pattern); an earlier mask is kept, and its zeros count
        toward the sparsity. Raises ``ValueError`` unless
        :meth:`runs_without_calibration`: statistics come from running the model.
        """
        if not self.runs_without_calibration():
            needs = f"the statistics {', '.join(sorted(self.STATISTICS))}" if self.STATISTICS else "weight updates"
            raise ValueError(f"{type(self).__name__} asks for {needs}")
        return LoneTensorMethod(self)

    def check_group(
        self,
        weights: Sequence[torch.Tensor],
        statistics: LayerStatistics,
        sparsities: Sequence[float],
    ) -> None:
        """Raise a clear error unless ``prune_group`` can work on these arguments.

        The weights must be float32 matrices on one device with a common ``in_features``,
        one sparsity each, and the statistics this method needs must be present and fit.
        """
        if not weights:
            raise ValueError("prune_group needs at least one weight")
        if len(sparsities) != len(weights):
            raise ValueError(f"got {len(weights)} weights but {len(sparsities)} sparsities")
        for sparsity in sparsities:
            check_sparsity(sparsity, "each layer's sparsity")
        in_features = weights[0].shape[-1]
        for weight in weights:
            if weight.dim() != 2:
                raise ValueError(f"weights must be [out, in] matrices, got shape {tuple(weight.shape)}")
            if weight.shape[1] != in_features:
                raise ValueError(
                    f"weights of one group must share in_features, got {in_features} and {weight.shape[1]}"
                )
            if weight.dtype != torch.float32:
                raise TypeError(f"weights must be float32, got {weight.dtype}")
            if weight.device != weights[0].device:
                raise ValueError(
                    f"weights of one group must be on one device, got {weights[0].device} and {weight.device}"
                )
        if self.n_m is not None and in_features % self.n_m[1]:
            raise ValueError(
                f"pattern {self.pattern!r} needs in_features divisible by {self.n_m[1]}, got {in_features}"
            )
        expected = {"input_sq_norms": (in_features,), "hessian": (in_features, in_features)}
        for name in sorted(self.STATISTICS):
            value = getattr(statistics, name) if name in FIELDS else statistics.extra.get(name)
            if value is None:
                raise ValueError(f"{type(self).__name__} needs the statistic {name!r}, which is missing")
            if name in expected and tuple(value.shape) != expected[name]:
                raise ValueError(f"statistic {name!r} has shape {tuple(value.shape)}, expected {expected[name]}")


class LoneTensorMethod(BasePruningMethod):
    """A calibrated method that needs no calibration, as a mask method for tensors without their model.

    ``PRUNING_TYPE`` is ``"global"``: on a tensor pruned before it sees the
    whole tensor and the earlier mask, whose zeros stay zero.
    """

    PRUNING_TYPE = "global"

    def __init__(self, method: CalibratedMethod) -> None:
        self.method = method

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        if t.dim() < 2:
            raise ValueError(f"{type(self.method).__name__} prunes matrices, not tensors of shape {list(t.shape)}")
        matrix = (t * default_mask).detach().reshape(t.shape[0], -1).to(torch.float32)
        [result] = self.method.prune_group([matrix], LayerStatistics(n_tokens=0), [self.method.sparsity])
        return result.mask.reshape(t.shape).to(device=default_mask.device, dtype=default_mask.dtype) * default_mask

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.method!r})"
