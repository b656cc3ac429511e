"""prunereg: weight pruning for PyTorch, with methods found by name through plugins.

``import prunereg`` stays light: torch, pluggy and the plugins are imported the
first time a name that needs them is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from prunereg import _legacy

if TYPE_CHECKING:
    from prunereg._core.compact import compact_masks
    from prunereg._core.global_pruning import global_unstructured
    from prunereg._core.method import BasePruningMethod, PruningContainer
    from prunereg._core.reparam import is_pruned
    from prunereg._core.tied import make_pruning_permanent, remove
    from prunereg._disk.errors import CheckpointError
    from prunereg._files.file_pruning import PruneFileReport, prune_file
    from prunereg._files.offline import apply_masks
    from prunereg._files.selection import parameters_to_prune
    from prunereg._gradual.huggingface import GradualPruningTrainerCallback
    from prunereg._gradual.lightning import GradualPruningCallback
    from prunereg._gradual.pruner import GradualPruning
    from prunereg._gradual.schedules import Schedule, schedule
    from prunereg._models.grouping import GroupedSummary, GroupSummary
    from prunereg._models.huggingface import from_pretrained, save_pretrained
    from prunereg._models.serialization import safe_globals
    from prunereg._models.slimmed import apply_slimmed_shapes, slimmed_shapes
    from prunereg._models.state_dict import load_state_dict
    from prunereg._models.summary import Summary, TensorSummary, summary
    from prunereg._oneshot.contract import CalibratedMethod, LayerStatistics, PrunedWeight
    from prunereg._oneshot.engine import oneshot
    from prunereg._oneshot.folder import oneshot_folder
    from prunereg._oneshot.perplexity import perplexity
    from prunereg._oneshot.report import OneShotReport
    from prunereg._plugins.hookspec import Register, hookimpl
    from prunereg._plugins.isolation import PluginCodeError
    from prunereg._plugins.registry import MethodInfo, PluginError, PluginInfo, PluginWarning, UnknownMethodError
    from prunereg._recover.contract import RecoveryMethod
    from prunereg._recover.data import RecoveryBlock, RecoveryModel
    from prunereg._recover.distillation import ZeroKeeper, distillation_loss, keep_zeros
    from prunereg._recover.engine import recover
    from prunereg._recover.folder import shrink_folder
    from prunereg._recover.report import BlockRecovery, RecoverReport
    from prunereg._recover.shrinking import shrink
    from prunereg._recover.trainer import DistillationTrainer
    from prunereg._runtime.least_squares import NormalEquations
    from prunereg._shrink.contract import BlockStatistics, ChannelStatistics, ExpertStatistics, ShrinkMethod
    from prunereg._shrink.report import ShrinkReport
    from prunereg._slim.engine import slim
    from prunereg._slim.folder import slim_folder
    from prunereg._slim.graph import SlimError
    from prunereg._slim.importance import Importance, get_importance, register_importance
    from prunereg._slim.report import SlimReport
    from prunereg._slim.rules import register_width_rule

__version__ = "0.1.0"

__all__ = [
    "BasePruningMethod",
    "BlockRecovery",
    "BlockStatistics",
    "CalibratedMethod",
    "ChannelStatistics",
    "CheckpointError",
    "DistillationTrainer",
    "ExpertStatistics",
    "GradualPruning",
    "GradualPruningCallback",
    "GradualPruningTrainerCallback",
    "GroupSummary",
    "GroupedSummary",
    "Importance",
    "LayerStatistics",
    "MethodInfo",
    "NormalEquations",
    "OneShotReport",
    "PluginCodeError",
    "PluginError",
    "PluginInfo",
    "PluginWarning",
    "PruneFileReport",
    "PrunedWeight",
    "PruningContainer",
    "RecoverReport",
    "RecoveryBlock",
    "RecoveryMethod",
    "RecoveryModel",
    "Register",
    "Schedule",
    "ShrinkMethod",
    "ShrinkReport",
    "SlimError",
    "SlimReport",
    "Summary",
    "TensorSummary",
    "UnknownMethodError",
    "ZeroKeeper",
    "apply_masks",
    "apply_slimmed_shapes",
    "compact_masks",
    "distillation_loss",
    "from_pretrained",
    "get",
    "get_importance",
    "global_unstructured",
    "hookimpl",
    "info",
    "is_pruned",
    "keep_zeros",
    "list_methods",
    "load_state_dict",
    "make_pruning_permanent",
    "oneshot",
    "oneshot_folder",
    "parameters_to_prune",
    "perplexity",
    "prune_file",
    "recover",
    "register",
    "register_importance",
    "register_width_rule",
    "remove",
    "safe_globals",
    "save_pretrained",
    "schedule",
    "shrink",
    "shrink_folder",
    "slim",
    "slim_folder",
    "slimmed_shapes",
    "summary",
]

_LAZY = {
    "BasePruningMethod": "prunereg._core.method",
    "BlockRecovery": "prunereg._recover.report",
    "BlockStatistics": "prunereg._shrink.contract",
    "CalibratedMethod": "prunereg._oneshot.contract",
    "ChannelStatistics": "prunereg._shrink.contract",
    "CheckpointError": "prunereg._disk.errors",
    "DistillationTrainer": "prunereg._recover.trainer",
    "ExpertStatistics": "prunereg._shrink.contract",
    "GradualPruning": "prunereg._gradual.pruner",
    "GradualPruningCallback": "prunereg._gradual.lightning",
    "GradualPruningTrainerCallback": "prunereg._gradual.huggingface",
    "GroupSummary": "prunereg._models.grouping",
    "GroupedSummary": "prunereg._models.grouping",
    "Importance": "prunereg._slim.importance",
    "LayerStatistics": "prunereg._oneshot.contract",
    "MethodInfo": "prunereg._plugins.registry",
    "NormalEquations": "prunereg._runtime.least_squares",
    "OneShotReport": "prunereg._oneshot.report",
    "PluginCodeError": "prunereg._plugins.isolation",
    "PluginError": "prunereg._plugins.registry",
    "PluginInfo": "prunereg._plugins.registry",
    "PluginWarning": "prunereg._plugins.registry",
    "PruneFileReport": "prunereg._files.file_pruning",
    "PrunedWeight": "prunereg._oneshot.contract",
    "PruningContainer": "prunereg._core.method",
    "RecoverReport": "prunereg._recover.report",
    "RecoveryBlock": "prunereg._recover.data",
    "RecoveryMethod": "prunereg._recover.contract",
    "RecoveryModel": "prunereg._recover.data",
    "Register": "prunereg._plugins.hookspec",
    "Schedule": "prunereg._gradual.schedules",
    "ShrinkMethod": "prunereg._shrink.contract",
    "ShrinkReport": "prunereg._shrink.report",
    "SlimError": "prunereg._slim.graph",
    "SlimReport": "prunereg._slim.report",
    "Summary": "prunereg._models.summary",
    "TensorSummary": "prunereg._models.summary",
    "UnknownMethodError": "prunereg._plugins.registry",
    "ZeroKeeper": "prunereg._recover.distillation",
    "apply_masks": "prunereg._files.offline",
    "apply_slimmed_shapes": "prunereg._models.slimmed",
    "compact_masks": "prunereg._core.compact",
    "distillation_loss": "prunereg._recover.distillation",
    "from_pretrained": "prunereg._models.huggingface",
    "get_importance": "prunereg._slim.importance",
    "global_unstructured": "prunereg._core.global_pruning",
    "hookimpl": "prunereg._plugins.hookspec",
    "is_pruned": "prunereg._core.reparam",
    "keep_zeros": "prunereg._recover.distillation",
    "load_state_dict": "prunereg._models.state_dict",
    "make_pruning_permanent": "prunereg._core.tied",
    "oneshot": "prunereg._oneshot.engine",
    "oneshot_folder": "prunereg._oneshot.folder",
    "parameters_to_prune": "prunereg._files.selection",
    "perplexity": "prunereg._oneshot.perplexity",
    "prune_file": "prunereg._files.file_pruning",
    "recover": "prunereg._recover.engine",
    "remove": "prunereg._core.tied",
    "safe_globals": "prunereg._models.serialization",
    "register_importance": "prunereg._slim.importance",
    "register_width_rule": "prunereg._slim.rules",
    "save_pretrained": "prunereg._models.huggingface",
    "schedule": "prunereg._gradual.schedules",
    "shrink": "prunereg._recover.shrinking",
    "shrink_folder": "prunereg._recover.folder",
    "slim": "prunereg._slim.engine",
    "slim_folder": "prunereg._slim.folder",
    "slimmed_shapes": "prunereg._models.slimmed",
    "summary": "prunereg._models.summary",
}

_Class = TypeVar("_Class", bound=type)

_legacy.install()  # pickles of pruned models written by prunereg 0.1 keep loading


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'prunereg' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # The public API only: not the helpers this module imports for itself (importlib, typing names).
    return sorted({*__all__, "__version__"})


def get(name: str) -> type[BasePruningMethod]:
    """The pruning-method class registered as ``name`` (or ``plugin:name``).

    >>> prunereg.get("ln_structured")(amount=0.3, n=2, dim=0)

    Raises :class:`UnknownMethodError` (a ``LookupError``) naming the closest
    matches, or saying why a registered method's class could not be imported.
    """
    from prunereg._plugins.loading import registry

    return registry().resolve(name)


def info(name: str) -> MethodInfo:
    """What the registry knows of ``name`` without importing its class: kind, summary, package."""
    from prunereg._plugins.loading import registry

    return registry().info(name)


def list_methods(kind: str | None = None) -> list[str]:
    """The names of all registered pruning methods (of one ``kind`` if given), sorted."""
    from prunereg._plugins.loading import registry

    return registry().names(kind)


def register(
    name: str, *, kind: str | None = None, summary: str | None = None, replace: bool = False
) -> Callable[[_Class], _Class]:
    """Class decorator: register a pruning method in this process only (notebooks, tests).

    ::

        @prunereg.register("half_magnitude", summary="Prune the smaller half")
        class HalfMagnitude(prunereg.BasePruningMethod):
            PRUNING_TYPE = "unstructured"
            ...

    ``kind`` defaults to the class's ``PRUNING_TYPE`` and ``summary`` to the
    first line of its docstring. The method belongs to the plugin ``local``
    (``get("local:half_magnitude")`` also works), or, when called while an
    installed plugin loads (at its import or in its hook), to that plugin. Registering a name ``local``
    already has redefines it; taking one from an installed plugin needs
    ``replace=True``, else ``ValueError``. Packages use the entry point instead.
    """

    def decorate(cls: _Class) -> _Class:
        from prunereg._plugins.loading import register_local

        first_doc_line = (cls.__doc__ or "").strip().splitlines()[:1]
        register_local(
            cls,
            name,
            # A class without PRUNING_TYPE gives None: the registry rejects it, naming the value.
            kind=kind if kind is not None else getattr(cls, "PRUNING_TYPE", None),  # type: ignore[arg-type]
            summary=summary if summary is not None else "".join(first_doc_line),
            replace=replace,
        )
        return cls

    return decorate
