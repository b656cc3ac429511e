"""The settings of one-shot pruning, spelled once: names, defaults, checks and help text.

:func:`prunereg.oneshot`, :func:`prunereg.oneshot_folder`, the engine's
:meth:`~prunereg._oneshot.engine.OneShotJob.prepare` and ``prunereg oneshot``
all take these settings. Each is a field of :class:`OneShotOptions`, whose
metadata holds its one-line help and how the command line offers it, so the
Python signatures, the command's flags and their help, and the docs' table
are read from here (:mod:`prunereg._runtime.options`). Every keyword the Python
functions take that is not a setting is an option of the method
(``blocksize=64``): :meth:`OneShotOptions.split` tells them apart.

This module imports no torch: the command line builds its flags from it.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from prunereg._runtime.options import (
    Options,
    batch_size_setting,
    blocks_setting,
    check_sparsity,
    data_parallel_setting,
    matmul_precision_setting,
    progress_setting,
    setting,
)

#: The ways a target sparsity is spread over the decoder blocks.
ALLOCATIONS = ("uniform", "owl")
#: OWL's defaults from the paper (Yin et al. 2024): outlier threshold M (times the mean score) and range lambda.
OWL_THRESHOLD = 5.0
OWL_LAMBDA = 0.08


@dataclass(frozen=True)
class OneShotOptions(Options):
    """The settings of one one-shot run, checked when made (``ValueError``/``TypeError`` in one line)."""

    COMMAND = "prunereg oneshot"

    sparsity: float | None = setting(
        None, "Share of each layer's weights to prune [default: 0.5, or N/M with a pattern].", metavar="X"
    )
    pattern: str | None = setting(
        None, "N:M pattern, e.g. 2:4 (N zeros in every M consecutive inputs of a row).", metavar="N:M"
    )
    allocation: str = setting(
        "uniform", "Each block's sparsity: the target everywhere, or OWL's from outlier ratios.", choices=ALLOCATIONS
    )
    owl_threshold: float = setting(OWL_THRESHOLD, "OWL's outlier threshold M (times the mean score).", metavar="M")
    owl_lambda: float = setting(OWL_LAMBDA, "OWL's sparsity range lambda, in [0, 0.5).", metavar="LAMBDA")
    layers: Sequence[str] | None = setting(
        None,
        "Prune only the layers inside the blocks whose full name matches a glob (model.layers.*.mlp.*).",
        metavar="GLOB",
        repeatable=True,
    )
    ignore: Sequence[str] = setting(
        (), "Leave out the layers whose full name matches a glob (*.self_attn.q_proj).", metavar="GLOB", repeatable=True
    )
    blocks: str | None = blocks_setting()
    batch_size: int = batch_size_setting()
    matmul_precision: str = matmul_precision_setting("statistics and pruning")
    permanent: bool = setting(
        True,
        "Leave plain weights with exact zeros; False also installs the reparametrization (weight_orig, weight_mask).",
        flag=None,
    )
    progress: bool | None = progress_setting()
    restore_on_error: bool | None = setting(
        None,
        "On a failure midway, put every pruned weight back [default: when a copy takes at most half the free memory].",
        flag=None,
    )
    data_parallel: bool = data_parallel_setting()

    def __post_init__(self) -> None:
        for name in ("layers", "ignore"):  # a single glob, or any sequence of them, is kept as a tuple
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, (value,))
            elif value is not None:
                object.__setattr__(self, name, tuple(value))
        self.check()

    def check(self) -> None:
        """Refuse a setting of the wrong type or out of range; nothing about the model is needed."""
        from prunereg._oneshot.contract import parse_pattern  # torch: imported when a run is checked

        if self.sparsity is not None:
            check_sparsity(self.sparsity)
        if self.pattern is not None:
            parse_pattern(self.pattern)
        check_allocation(self.allocation, self.pattern)
        for name in ("owl_threshold", "owl_lambda"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a number, not {type(value).__name__}")
        if not self.owl_threshold > 0:
            raise ValueError(f"owl_threshold must be > 0, got {self.owl_threshold!r}")
        if not 0 <= self.owl_lambda < 0.5:
            raise ValueError(f"owl_lambda must be in [0, 0.5), got {self.owl_lambda!r}")
        for name in ("layers", "ignore"):
            globs = getattr(self, name)
            if globs is not None and not all(isinstance(glob, str) for glob in globs):
                raise TypeError(f"{name} must be glob patterns (str), got {globs!r}")
        self.check_engine_settings()


def check_allocation(allocation: object, pattern: str | None) -> None:
    """Refuse an unknown ``allocation``, and OWL with an N:M ``pattern`` (which fixes every block's sparsity)."""
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation must be one of {', '.join(map(repr, ALLOCATIONS))}, not {allocation!r}")
    if allocation == "owl" and pattern is not None:
        raise ValueError("allocation='owl' sets each block's sparsity, which an N:M pattern fixes; use one of them")
