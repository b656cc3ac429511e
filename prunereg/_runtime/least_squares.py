"""The statistics of a linear least-squares fit, on the runtime's protocol: what recovery's refits solve.

:class:`LeastSquares` is a ``module_call`` statistic: for each call of a module
(a writer projection, an MLP) it folds in the rows ``X`` of what the fitted
map reads and ``R`` of what it must produce, as its ``fit`` draws them from the
observation (the module's own input and output by default; recovery's fits
subtract the rest of the block's output from the dense model's target). A
chunk's products are made in float32 (float64 for float64 inputs: exact) and
the sums of chunks and batches in float64: on a CPU the float64 products took
half of a refit's time, and SmolLM2-135M's perplexity after a refit moved by
0.001 at most (docs/shrinking.md). The sums add in a fixed order as the others' do
(:meth:`~LeastSquares.combine`), so every engine's statistics are gathered,
and later all-reduced, one way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from prunereg._runtime.gram import add_product, add_upper_gram, mirror_upper_gram
from prunereg._runtime.statistics import Observation, Statistic, same_kind

#: Rows whose products are made at a time.
CHUNK = 4096

#: What a fit reads from one observation: the fitted map's inputs and what it must produce, ``[..., width]`` each.
Fit = Callable[[Observation], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class NormalEquations:
    """Float64 statistics of a linear fit ``[X 1] A ~ R`` over the calibration tokens (one row per token).

    ``gram`` is ``[X 1]^T [X 1]`` (``[inputs + 1, inputs + 1]``, the constant
    last), ``cross`` is ``[X 1]^T R`` (``[inputs + 1, outputs]``) and
    ``target_sq`` is the sum of ``R ** 2`` per output, so that the squared error
    of any ``A`` is ``target_sq - 2 A^T cross + A^T gram A`` per output, without
    the tokens. ``X`` holds the inputs as the block has them now, ``R`` what the
    fitted map must produce for the block's output to equal the target.
    """

    gram: Tensor
    cross: Tensor
    target_sq: Tensor
    n_tokens: int

    @property
    def n_inputs(self) -> int:
        return int(self.gram.shape[0]) - 1

    def squared_error(self, weight: Tensor, bias: Tensor | None = None) -> float:
        """The sum over tokens and outputs of ``(X weight^T + bias - R) ** 2``; ``weight`` is ``[out, in]``."""
        coefficients = torch.cat([weight.double().T, _bias_row(bias, weight)])
        fitted = (coefficients * (self.gram @ coefficients)).sum(0) - 2 * (coefficients * self.cross).sum(0)
        return float((self.target_sq + fitted).sum())


def _bias_row(bias: Tensor | None, weight: Tensor) -> Tensor:
    if bias is None:
        return torch.zeros(1, weight.shape[0], dtype=torch.float64, device=weight.device)
    return bias.double().reshape(1, -1)


def own_output(observation: Observation) -> tuple[Tensor, Tensor]:
    """The module's input and output: the fit of a module's own map (the default of :class:`LeastSquares`)."""
    if observation.inputs is None or observation.outputs is None:
        raise ValueError("least_squares observes a module called with a tensor that returns one")
    return observation.inputs, observation.outputs


class LeastSquares(Statistic):
    """``[X 1]^T [X 1]``, ``[X 1]^T R`` and the sum of ``R ** 2`` over every token, summed in float64.

    ``fit`` gives each observation's ``X`` and ``R`` (:data:`Fit`). The Gram
    matrix is summed by its upper tiles, :data:`CHUNK` rows at a time, and
    mirrored when read; one chunk's float32 products stay so until a second
    chunk or a combine widens the sums to float64. The result is a float64
    :class:`NormalEquations` (None before any token).
    """

    NAME = "least_squares"
    SITE = "module_call"

    def __init__(self, fit: Fit = own_output) -> None:
        self.fit = fit
        self.gram: Tensor | None = None
        self.cross: Tensor | None = None
        self.target_sq: Tensor | None = None
        self.n_tokens = 0

    def fold(self, observation: Observation) -> None:
        inputs, wanted = self.fit(observation)
        inputs = inputs.detach().reshape(-1, inputs.shape[-1])
        wanted = wanted.detach().reshape(-1, wanted.shape[-1])
        products = torch.float64 if torch.float64 in (inputs.dtype, wanted.dtype) else torch.float32
        for start in range(0, inputs.shape[0], CHUNK):
            x = inputs[start : start + CHUNK].to(products)
            r = wanted[start : start + CHUNK].to(products)
            x = torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)
            if self.gram is None or self.cross is None or self.target_sq is None:  # this chunk's products are the sums
                self.gram = x.new_zeros(x.shape[1], x.shape[1])
                self.cross = x.T @ r
                self.target_sq = torch.zeros(r.shape[1], dtype=torch.float64, device=r.device)
            else:
                self._widen()
                add_product(self.cross, x.T, r)
            add_upper_gram(self.gram, x, beta=1.0, alpha=1.0)
            self.target_sq += r.double().square().sum(0)
            self.n_tokens += x.shape[0]

    def _widen(self) -> None:
        """Hold the sums in float64 from now on (one chunk's products may be float32)."""
        assert self.gram is not None and self.cross is not None
        self.gram, self.cross = self.gram.double(), self.cross.double()

    def combine(self, other: Statistic) -> None:
        theirs = same_kind(other, LeastSquares)
        if theirs.gram is None:
            return
        if self.gram is None or self.cross is None or self.target_sq is None:
            self.gram, self.cross, self.target_sq = theirs.gram.clone(), theirs.cross.clone(), theirs.target_sq.clone()
        else:
            self._widen()
            assert self.gram is not None and self.cross is not None
            self.gram += theirs.gram  # their lower tiles may be stale: the upper ones are mirrored when read
            self.cross += theirs.cross
            self.target_sq += theirs.target_sq
        self.n_tokens += theirs.n_tokens

    def state(self) -> dict[str, Any]:
        """The sums as tensors and numbers only (no ``fit``): what ranks exchange, loadable with ``weights_only``."""
        return {"gram": self.gram, "cross": self.cross, "target_sq": self.target_sq, "n_tokens": self.n_tokens}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Take the sums of :meth:`state` (another rank's), in place of this statistic's own."""
        self.gram, self.cross, self.target_sq = state["gram"], state["cross"], state["target_sq"]
        self.n_tokens = int(state["n_tokens"])

    def result(self) -> NormalEquations | None:
        if self.gram is None or self.cross is None or self.target_sq is None:
            return None
        self._widen()
        assert self.gram is not None and self.cross is not None
        mirror_upper_gram(self.gram)
        return NormalEquations(self.gram, self.cross, self.target_sq, self.n_tokens)
