"""The base of every block-by-block engine's settings, spelled once: names, defaults, checks and help text.

An engine's settings are a frozen dataclass subclassing :class:`Options`
(``prunereg._oneshot.settings.OneShotOptions``,
``prunereg._shrink.options.ShrinkOptions``), each field made by :func:`setting`
with its one-line help and how the command line offers it, so the Python
signatures (:func:`with_options_signature`), the command's flags and their help,
and the docs' tables (:func:`options_table`, ``docs/_ext/generated.py``) are
read from the class. The settings every such engine shares (``blocks``,
``batch_size``, ``matmul_precision``, ``progress``) are made here once. Every
keyword a Python function takes that is not a setting is an option of the
method (``blocksize=64``): :meth:`Options.split` tells them apart.

This module imports no torch: the command line builds its flags from it.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prunereg._runtime.precision import MATMUL_PRECISIONS, check_matmul_precision


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


def data_parallel_setting() -> Any:
    """``data_parallel``: split the calibration over the ranks of torch.distributed, for every block-by-block engine."""
    return setting(
        True,
        "When torch.distributed is initialized (torchrun), each rank calibrates on its share of the samples and the "
        "ranks combine their statistics: the result of one process on all samples, on every rank. False: every rank "
        "runs alone on all its samples.",
        flag=None,
    )


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


def check_sparsity(sparsity: object, what: str = "sparsity") -> float:
    """``sparsity`` as a float in [0, 1): a TypeError for a non-number, a ValueError outside the range.

    The one check of a share of weights or units (a sparsity, a shrink share, a schedule's level).
    """
    if isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real):
        raise TypeError(f"{what} must be a number in [0, 1), not {type(sparsity).__name__}")
    value = float(sparsity)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{what} must be in [0, 1), got {sparsity!r}")
    return value


class Options:
    """What every engine's settings dataclass shares (``OneShotOptions``, ``ShrinkOptions``).

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
        """Check the settings every block-by-block engine has: ``blocks``, ``batch_size``, ``matmul_precision``.

        And ``data_parallel``, where the engine has it.
        """
        batch_size, blocks = getattr(self, "batch_size"), getattr(self, "blocks")  # noqa: B009  # a subclass's fields
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if blocks is not None and not isinstance(blocks, str):
            raise TypeError(f"blocks must be a module path like 'model.layers', not {type(blocks).__name__}")
        check_matmul_precision(getattr(self, "matmul_precision"))  # noqa: B009
        data_parallel = getattr(self, "data_parallel", True)
        if not isinstance(data_parallel, bool):
            raise TypeError(f"data_parallel must be True or False, not {type(data_parallel).__name__}")

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


_F = TypeVar("_F", bound=Callable[..., Any])


def with_options_signature(options: type[Options], *, leave_out: Iterable[str] = ()) -> Callable[[_F], _F]:
    """Show a function taking ``**options`` with every setting as a keyword (``help()``, ``inspect.signature``).

    The function's own parameters stay; its ``**options`` becomes the settings
    (but ``leave_out``) with their defaults, followed by ``**method_options``.
    """
    left_out = set(leave_out)

    def decorate(function: _F) -> _F:
        signature = inspect.signature(function)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        settings = [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=_annotation(name, options)
            )
            for name, (default, _) in options.settings().items()
            if name not in left_out and name not in {p.name for p in own}
        ]
        rest = inspect.Parameter("method_options", inspect.Parameter.VAR_KEYWORD, annotation="Any")
        function.__signature__ = signature.replace(parameters=[*own, *settings, rest])  # type: ignore[attr-defined]
        return function

    return decorate


def _annotation(name: str, options: type[Options]) -> Any:
    return {f.name: f.type for f in dataclasses.fields(options)}[name]  # type: ignore[arg-type]


def value_type(name: str, options: type[Options]) -> type:
    """The type of one value of setting ``name`` (``float`` for ``float | None``, ``str`` for globs)."""
    # the annotations are text (``from __future__ import annotations``)
    spelled = str(_annotation(name, options)).split(" | ")
    for kind in (bool, int, float):
        if kind.__name__ in spelled:
            return kind
    return str


def options_table(options: type[Options], leave_out: Sequence[str] = ()) -> str:
    """The settings as a Markdown table: keyword, the command's flag, default, what it does (for the docs)."""
    rows = [f"| keyword | `{options.COMMAND}` | default | what it sets |", "| --- | --- | --- | --- |"]
    for name, (default, setting) in options.settings().items():
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
