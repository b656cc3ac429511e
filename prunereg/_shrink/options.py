"""The settings of shrinking, spelled once: names, defaults, checks and help text.

:func:`prunereg.shrink`, :func:`prunereg.shrink_folder`, the engine's
:meth:`~prunereg._shrink.engine.ShrinkJob.prepare` and ``prunereg shrink`` all
take these settings, as :class:`~prunereg._oneshot.settings.OneShotOptions` is
taken by one-shot pruning (:mod:`prunereg._runtime.options`): the Python signatures, the command's flags and their
help, and the docs' table (``docs/_ext/generated.py``) are read from here. Every
other keyword of the Python functions is an option of the method
(``compensate=False``).

This module imports no torch: the command line builds its flags from it.
"""

from __future__ import annotations

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

#: How the units removed are spread over the decoder blocks.
ALLOCATIONS = ("uniform", "global")


@dataclass(frozen=True)
class ShrinkOptions(Options):
    """The settings of one shrink run, checked when made (``ValueError``/``TypeError`` in one line)."""

    COMMAND = "prunereg shrink"

    mlp: float = setting(0.0, "Share of each MLP's intermediate channels removed.", metavar="X")
    heads: float = setting(
        0.0, "Share of each attention's key/value groups removed, each with its query heads.", metavar="X"
    )
    layers: int = setting(0, "Number of decoder blocks removed, the lowest-scored.", metavar="N", minimum=0)
    experts: float = setting(0.0, "Share of each mixture-of-experts layer's experts removed.", metavar="X")
    allocation: str = setting(
        "uniform",
        "Which blocks lose the units: the same number in every block (the config states it), or the lowest "
        "standardized scores across blocks (needs prunereg.from_pretrained; not with streaming).",
        choices=ALLOCATIONS,
    )
    recover: str | object | None = setting(
        None,
        "A recovery method (refit, blockwise) run on each block right after its cut, against the dense block's "
        "outputs this pass already sees [default: none].",
        metavar="METHOD",
    )  # in Python also a configured method: prunereg.get("blockwise")(epochs=3)
    steps: int = setting(
        1, "Rounds of shrinking (each followed by the recovery) that together remove what is asked.", minimum=1
    )
    blocks: str | None = blocks_setting()
    batch_size: int = batch_size_setting()
    matmul_precision: str = matmul_precision_setting("statistics and scores")
    progress: bool | None = progress_setting()
    restore_on_error: bool = setting(
        True,
        "On a failure midway, put every replaced tensor, attribute and config value back (keeps a copy of them).",
        flag=None,
    )
    data_parallel: bool = data_parallel_setting()

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse a setting of the wrong type or out of range; nothing about the model is needed."""
        for name in ("mlp", "heads", "experts"):
            object.__setattr__(self, name, check_sparsity(getattr(self, name), name))
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 0:
            raise ValueError(f"layers must be a number of blocks (an int >= 0), not {self.layers!r}")
        if self.recover is not None and not isinstance(self.recover, str) and not _configured_method(self.recover):
            raise TypeError(
                "recover must be a recovery method's name (refit, blockwise) or a configured one "
                f"(prunereg.get('blockwise')(epochs=3)), not {self.recover!r}"
            )
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be a number of rounds (an int >= 1), not {self.steps!r}")
        if self.allocation not in ALLOCATIONS:
            raise ValueError(f"allocation must be one of {', '.join(map(repr, ALLOCATIONS))}, not {self.allocation!r}")
        self.check_engine_settings()

    def wanted(self) -> list[str]:
        """The settings that remove something (``mlp``, ``heads``, ``experts``, ``layers``), in that order."""
        return [name for name in ("mlp", "heads", "experts") if getattr(self, name) > 0] + (
            ["layers"] if self.layers else []
        )


def _configured_method(value: object) -> bool:
    """Whether ``value`` is a method instance (this module cannot name the recovery contract: it sits below it)."""
    return not isinstance(value, type) and isinstance(getattr(type(value), "PRUNING_TYPE", None), str)
