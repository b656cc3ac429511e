"""The settings of one-shot pruning, spelled once: names, defaults, checks and help text.

:func:`prunereg.oneshot`, :func:`prunereg.oneshot_folder`, the engine's
:meth:`~prunereg._oneshot.engine.OneShotJob.prepare` and ``prunereg oneshot``
all take these settings. Each is a field of :class:`OneShotOptions`, whose
metadata holds its one-line help and how the command line offers it, so the
Python signatures (:func:`with_options_signature`), the command's flags and
their help, and the docs' table (``docs/_ext/generated.py``) are read from here.
Every keyword the Python functions take that is not a setting is an option of
the method (``blocksize=64``): :meth:`OneShotOptions.split` tells them apart.

This module imports no torch: the command line builds its flags from it.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prunereg._oneshot.precision import MATMUL_PRECISIONS, check_matmul_precision

#: The ways a target sparsity is spread over the decoder blocks.
ALLOCATIONS = ("uniform", "owl")
#: OWL's defaults from the paper (Yin et al. 2024): outlier threshold M (times the mean score) and range lambda.
OWL_THRESHOLD = 5.0
OWL_LAMBDA = 0.08


@dataclass(frozen=True)
class Setting:
    """How one setting is described and offered: its help, and its command-line flag (None: no flag of its own)."""

    help: str
    flag: str | None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    repeatable: bool = False


def setting(
    default: Any,
    help: str,  # the name click and argparse give it
    *,
    flag: str | None = "",
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    minimum: int | None = None,
    repeatable: bool = False,
) -> Any:
    """A dataclass field with its :class:`Setting`; ``flag=""`` derives ``--the-name``, ``None`` offers none."""
    return field(
        default=default,
        metadata={"setting": Setting(help, flag, metavar, choices, minimum, repeatable)},
    )


_O = TypeVar("_O", bound="Options")


def blocks_setting() -> Any:
    """``blocks``: where the decoder blocks are, for every block-by-block engine (one-shot pruning, shrinking)."""
    return setting(
        None,
        "The nn.ModuleList holding the decoder blocks (model.layers), for an architecture prunereg does not know.",
        metavar="PATH",
    )


def batch_size_setting() -> Any:
    """``batch_size``: calibration samples per forward, for every block-by-block engine."""
    return setting(2, "Calibration samples per forward.", metavar="N", minimum=1)


def matmul_precision_setting(exact: str) -> Any:
    """``matmul_precision`` of the calibration forwards; ``exact`` names what always runs in full float32."""
    return setting(
        "medium",
        f"float32 matmul precision of the calibration forwards; {exact} always run in full float32.",
        choices=MATMUL_PRECISIONS,
    )


def progress_setting() -> Any:
    """``progress``: a bar per block (a line per block in a log), for every block-by-block engine."""
    return setting(
        None,
        "Progress on stderr: a bar per block, or with True off a terminal a line per block "
        "[default: a bar when stderr is a terminal or a notebook, else nothing].",
        flag=None,
    )


class Options:
    """What every settings dataclass shares (:class:`OneShotOptions`, ``prunereg._shrink.options.ShrinkOptions``).

    Each field holds a :class:`Setting` in its metadata (made by :func:`setting`),
    so the names, defaults, help and flags are read from the class itself.
    """

    #: The command whose flags the settings are, as the docs' table names it.
    COMMAND = ""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every setting's name, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    @classmethod
    def settings(cls) -> dict[str, tuple[Any, Setting]]:
        """Each setting's name -> (default, :class:`Setting`), in order."""
        return {f.name: (f.default, f.metadata["setting"]) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

    def check_engine_settings(self) -> None:
        """Check the settings every block-by-block engine has: ``blocks``, ``batch_size``, ``matmul_precision``."""
        batch_size, blocks = getattr(self, "batch_size"), getattr(self, "blocks")  # noqa: B009  # a subclass's fields
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if blocks is not None and not isinstance(blocks, str):
            raise TypeError(f"blocks must be a module path like 'model.layers', not {type(blocks).__name__}")
        check_matmul_precision(getattr(self, "matmul_precision"))  # noqa: B009

    @classmethod
    def split(
        cls: type[_O], keywords: Mapping[str, Any], *, refused: Mapping[str, str] | None = None
    ) -> tuple[_O, dict[str, Any]]:
        """``keywords`` as (the settings among them, checked; the method's options: the rest).

        ``refused`` maps settings a caller does not take to why (a TypeError says it).
        """
        for name, why in (refused or {}).items():
            if name in keywords:
                raise TypeError(f"{name!r} is not taken here: {why}")
        own = set(cls.names())
        settings = {key: value for key, value in keywords.items() if key in own}
        return cls(**settings), {key: value for key, value in keywords.items() if key not in own}


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
        from prunereg._oneshot.contract import check_sparsity, parse_pattern

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


_F = TypeVar("_F", bound=Callable[..., Any])


def with_options_signature(
    options: type[Options] | None = None, *, leave_out: Iterable[str] = ()
) -> Callable[[_F], _F]:
    """Show a function taking ``**options`` with every setting as a keyword (``help()``, ``inspect.signature``).

    The function's own parameters stay; its ``**options`` becomes the settings
    (but ``leave_out``) with their defaults, followed by ``**method_options``.
    """
    left_out = set(leave_out)
    kind = options or OneShotOptions

    def decorate(function: _F) -> _F:
        signature = inspect.signature(function)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        settings = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=_annotation(name, kind))
            for name, (default, _) in kind.settings().items()
            if name not in left_out and name not in {p.name for p in own}
        ]
        rest = inspect.Parameter("method_options", inspect.Parameter.VAR_KEYWORD, annotation="Any")
        function.__signature__ = signature.replace(parameters=[*own, *settings, rest])  # type: ignore[attr-defined]
        return function

    return decorate


def _annotation(name: str, options: type[Options]) -> Any:
    return {f.name: f.type for f in dataclasses.fields(options)}[name]  # type: ignore[arg-type]


def value_type(name: str, options: type[Options] | None = None) -> type:
    """The type of one value of setting ``name`` (``float`` for ``float | None``, ``str`` for globs)."""
    # the annotations are text (``from __future__ import annotations``)
    spelled = str(_annotation(name, options or OneShotOptions)).split(" | ")
    for kind in (bool, int, float):
        if kind.__name__ in spelled:
            return kind
    return str


def options_table(leave_out: Sequence[str] = (), options: type[Options] | None = None) -> str:
    """The settings as a Markdown table: keyword, the command's flag, default, what it does (for the docs)."""
    kind = options or OneShotOptions
    rows = [f"| keyword | `{kind.COMMAND}` | default | what it sets |", "| --- | --- | --- | --- |"]
    for name, (default, setting) in kind.settings().items():
        if name in leave_out:
            continue
        flag = cli_flag(name, setting)
        shown_flag = f"`{flag}`" if flag is not None else "-"
        described = setting.help.replace("|", "\\|").replace("*", "\\*")  # Markdown's table cells and emphasis
        rows.append(f"| `{name}` | {shown_flag} | `{default!r}` | {described} |")
    return "\n".join(rows) + "\n"


def cli_flag(name: str, setting: Setting) -> str | None:
    """The command-line flag of setting ``name``: ``--the-name`` unless the setting says otherwise."""
    if setting.flag is None:
        return None
    return setting.flag or "--" + name.replace("_", "-")
