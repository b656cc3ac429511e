"""Calibration statistics of a block's layers, gathered once per input group.

Layers that read the same input tensor (q/k/v of an attention, gate/up of a
gated MLP) form one *input group*: their statistics are the same, so they are
gathered once, from the group's first layer. Groups are found on the first
calibration batch by tensor identity (which layer received which tensor object);
after it, only one hook per group stays. Sums run in float32 with batched
matrix products over every token of a batch at once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from prunereg._runtime.capture import RestNotNeeded
from prunereg._runtime.precision import matmul_precision


class InputStatistics(NamedTuple):
    """The statistics of one input: its token count, and the sums asked for (else None)."""

    n_tokens: int
    input_sq_norms: Tensor | None
    hessian: Tensor | None


class RunningStatistics:
    """The statistics of one input, updated batch by batch: token count, squared norms, Hessian."""

    def __init__(self, needs: Iterable[str]) -> None:
        self.needs = frozenset(needs)
        self.n_tokens = 0
        self.input_sq_norms: Tensor | None = None
        self.hessian: Tensor | None = None

    def add(self, x: Tensor) -> None:
        """Fold in a batch of inputs ``[..., in_features]``: every leading index is one token."""
        tokens = x.detach().reshape(-1, x.shape[-1]).float()
        seen, batch = self.n_tokens, tokens.shape[0]
        self.n_tokens = seen + batch
        if "input_sq_norms" in self.needs:
            sq_norms = tokens.square().sum(dim=0)
            self.input_sq_norms = sq_norms if self.input_sq_norms is None else self.input_sq_norms.add_(sq_norms)
        if "hessian" in self.needs:
            # A running mean of 2 x x^T, as SparseGPT's reference keeps it: the scale stays that of one token.
            if self.hessian is None:
                self.hessian = torch.zeros(tokens.shape[1], tokens.shape[1], dtype=torch.float32, device=x.device)
            with matmul_precision("highest"):  # the forwards around this hook may run with faster products
                add_upper_gram(self.hessian, tokens, beta=seen / self.n_tokens, alpha=2.0 / self.n_tokens)

    def result(self) -> InputStatistics:
        """The statistics so far; the Hessian is the running tensor itself, its lower tiles filled in place."""
        if self.hessian is not None:
            mirror_upper_gram(self.hessian)
        return InputStatistics(self.n_tokens, self.input_sq_norms, self.hessian)


#: Side of the square tiles in which :func:`add_upper_gram` sums a Gram matrix.
GRAM_TILE = 256


def add_upper_gram(gram: Tensor, x: Tensor, *, beta: float, alpha: float) -> None:
    """``gram = beta * gram + alpha * x^T x`` on the tiles on and above the diagonal; the others are left alone.

    ``x^T x`` is symmetric, so a quarter to a half of its products (per the width)
    need not be computed; the lower tiles are filled from the upper ones once, at the end.
    """
    width = x.shape[1]
    for row in range(0, width, GRAM_TILE):
        rows = slice(row, row + GRAM_TILE)
        for column in range(row, width, GRAM_TILE):
            columns = slice(column, column + GRAM_TILE)
            gram[rows, columns].addmm_(x[:, rows].T, x[:, columns], beta=beta, alpha=alpha)


def mirror_upper_gram(gram: Tensor) -> None:
    """Fill the tiles below the diagonal of a Gram matrix that :func:`add_upper_gram` summed, in place.

    Tile by tile, so that no second full-size matrix is ever allocated (a wide MLP's
    Hessian is gigabytes); the diagonal tiles are made exactly symmetric as well.
    """
    width = gram.shape[0]
    for row in range(0, width, GRAM_TILE):
        rows = slice(row, row + GRAM_TILE)
        diagonal = gram[rows, rows]
        diagonal.copy_(diagonal.triu() + diagonal.triu(diagonal=1).T)
        for column in range(row + GRAM_TILE, width, GRAM_TILE):
            columns = slice(column, column + GRAM_TILE)
            gram[columns, rows].copy_(gram[rows, columns].T)


class GroupRecorder:
    """Forward pre-hooks on a block's layers that gather each input group's statistics.

    Use as a context manager around the calibration forwards of one block, and
    run each batch inside :meth:`batch`. :attr:`groups` lists the groups (layer
    names in first-call order) and :attr:`seconds` the time spent in the hooks.
    From the second batch on, the forward stops (:class:`RestNotNeeded`,
    caught by :meth:`batch`) once the last group's input is recorded: the rest of
    the block (the last layer's product, usually the MLP's down projection) is
    not needed for statistics.
    """

    def __init__(self, layers: dict[str, nn.Module], needs: Iterable[str]) -> None:
        self.layers = layers
        self.needs = frozenset(needs)
        self.groups: list[list[str]] = []
        self.statistics: list[RunningStatistics] = []
        self.seconds = 0.0
        self._first_batch = True
        self._inputs_seen: list[Tensor] = []  # the first batch's group inputs, kept alive so identity is sound
        self._handles: dict[str, Any] = {}
        self._leader_index: dict[str, int] = {}

    def __enter__(self) -> GroupRecorder:
        for name, layer in self.layers.items():
            self._handles[name] = layer.register_forward_pre_hook(self._hook(name))
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()
        self._inputs_seen.clear()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Around one batch's forward through the block."""
        with contextlib.suppress(RestNotNeeded):
            yield
        self._batch_done()

    def _batch_done(self) -> None:
        """After the first batch, keep only one hook per group: the other layers read the same tensor."""
        if not self._first_batch:
            return
        self._first_batch = False
        self._inputs_seen.clear()
        self._leader_index = {group[0]: index for index, group in enumerate(self.groups)}
        for name in list(self._handles):
            if name not in self._leader_index:
                self._handles.pop(name).remove()

    def group_statistics(self) -> list[tuple[list[str], InputStatistics]]:
        """Each group's layer names with its statistics; layers the forward never called are absent."""
        return [(group, stats.result()) for group, stats in zip(self.groups, self.statistics, strict=True)]

    def _hook(self, name: str) -> Any:
        def record(module: nn.Module, args: tuple[Any, ...]) -> None:
            start = time.perf_counter()
            x = args[0]
            index = self._group_of(name, x)
            if index is not None:
                self.statistics[index].add(x)
            self.seconds += time.perf_counter() - start
            if not self._first_batch and index == len(self.groups) - 1:
                raise RestNotNeeded

        return record

    def _group_of(self, name: str, x: Tensor) -> int | None:
        """The index of the group whose statistics ``x`` should update, or None if already counted."""
        if not self._first_batch:
            return self._leader_index[name]
        for index, seen in enumerate(self._inputs_seen):
            if seen is x:
                if name not in self.groups[index]:
                    self.groups[index].append(name)
                return None
        self._inputs_seen.append(x)
        self.groups.append([name])
        self.statistics.append(RunningStatistics(self.needs))
        return len(self.groups) - 1
