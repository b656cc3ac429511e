"""The contract for recovery methods: bringing a shrunk or pruned model's output back to its teacher's.

A recovery method works either one decoder block at a time (``SCOPE =
"block"``: :meth:`RecoveryMethod.recover_block` gets a
:class:`~prunereg._recover.data.RecoveryBlock`: the block, its calibration
inputs along the recovered model's own trajectory, the dense model's outputs to
match, and the statistics it asks for) or on the whole model (``SCOPE =
"model"``: :meth:`RecoveryMethod.recover_model` gets a
:class:`~prunereg._recover.data.RecoveryModel`). Either way it changes only the
values of parameters that exist (shapes, dtypes and devices kept), and on a
masked model only the weights the masks keep: every zero stays zero. The engine
checks both, and keeps whichever is better on the calibration objective, the
block before or after the method.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from prunereg._plugins.isolation import guard_plugin_methods

if TYPE_CHECKING:
    from prunereg._recover.data import RecoveryBlock, RecoveryModel

KIND = "recovery"

#: What a method recovers at a time.
SCOPES = ("block", "model")
#: What the engine gathers for a block method on request: the dense model's residual stream after attention.
STATISTIC_NAMES = frozenset({"attention_residual"})
#: The writer projections whose bias the engine can switch on (``mlp_bias``, ``attention_bias``).
WRITER_KINDS = frozenset({"mlp", "attention"})


class RecoveryMethod:
    """A method that brings a shrunk or pruned model's outputs back towards the dense model's.

    Subclasses set ``SCOPE`` and implement :meth:`recover_block` (``"block"``)
    or :meth:`recover_model` (``"model"``). ``STATISTICS`` names what the
    engine gathers besides the block's targets (``"attention_residual"``: the
    dense model's residual stream after each block's attention, which
    :meth:`~prunereg._recover.data.RecoveryBlock.normal_equations` needs for
    ``"attention"``). :attr:`writer_biases` asks the engine to give the writer
    projections of those kinds a zero bias in every block, where the config
    has a flag that makes stock ``from_pretrained`` build one (Llama's
    ``mlp_bias`` / ``attention_bias``), before the first block.

    ``DATA_PARALLEL = True`` says that a block method reads the calibration
    data only through what the block combines over the ranks of
    torch.distributed (:meth:`~prunereg._recover.data.RecoveryBlock.normal_equations`,
    ``loss``, ``evaluate``, ``writer``, ``mlp``), so that each rank can hold a
    share of the batches and every rank ends with one process's result. A
    method without it (one that trains on the batches itself) is refused under ranks.
    """

    PRUNING_TYPE: ClassVar[str] = KIND
    SCOPE: ClassVar[str] = "block"
    STATISTICS: ClassVar[frozenset[str]] = frozenset()
    DATA_PARALLEL: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.SCOPE not in SCOPES:
            raise TypeError(f"{cls.__name__}.SCOPE must be one of {', '.join(SCOPES)}, not {cls.SCOPE!r}")
        unknown = set(cls.STATISTICS) - STATISTIC_NAMES
        if unknown:
            raise TypeError(f"{cls.__name__}.STATISTICS names unknown entries: {', '.join(sorted(unknown))}")
        # A third-party method runs as plugin code: sys.exit() in it is an error, its prints go to stderr.
        guard_plugin_methods(cls, ("__init__", "recover_block", "recover_model"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @property
    def writer_biases(self) -> frozenset[str]:
        """The writer kinds (``"mlp"``, ``"attention"``) whose bias the engine switches on where the config can."""
        return frozenset()

    def reads_attention_residual(self, changed: frozenset[str]) -> bool:
        """Whether the engine keeps the dense residual after attention for a block whose ``changed`` parts these are.

        ``"attention_residual"`` in ``STATISTICS`` asks for it on every block.
        A method that reads it on some blocks only (an attention refit, where
        the attention is no longer the dense one) says which here: on the
        others the engine lets that set of the calibration's hidden states go
        before the method runs.
        """
        return "attention_residual" in self.STATISTICS

    @property
    def reads_dense_inputs(self) -> bool:
        """Whether the engine keeps each block's dense inputs for :meth:`RecoveryBlock.forward`'s ``dense_inputs``.

        They cost one more set of the calibration's hidden states while a block
        is recovered, so the engine keeps them only for a method that says so.
        """
        return False

    def recover_block(self, block: RecoveryBlock) -> str | None:
        """Change ``block.module``'s parameters in place so that its outputs come closer to ``block``'s targets.

        Returns a short note for the report (what changed, or why nothing did), or None.
        """
        raise NotImplementedError(f"{type(self).__name__} does not recover one block at a time")

    def recover_model(self, model: RecoveryModel) -> str | None:
        """Change ``model.student``'s parameters in place so that its outputs come closer to ``model.teacher``'s.

        Returns a short note for the report, or None.
        """
        raise NotImplementedError(f"{type(self).__name__} does not recover a whole model")
