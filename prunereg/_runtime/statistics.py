"""The statistics protocol: what a block-by-block run gathers from calibration activations, and how.

A statistic is a subclass of :class:`Statistic` with a ``NAME``, the ``SITE``
where it is observed, and three methods: :meth:`~Statistic.fold` takes in one
calibration batch as an :class:`Observation`, :meth:`~Statistic.combine` takes
in a partial result gathered over other batches (on another rank, say), and
:meth:`~Statistic.result` gives what a method reads. The sites are

- ``"layer_input"``: the input a group of Linear layers reads (q/k/v of an
  attention, gate/up of an MLP, an output projection): ``observation.inputs``;
- ``"block"``: a decoder block's input and output hidden states:
  ``observation.inputs`` and ``observation.outputs``;
- ``"module_call"``: a call of a module inside the block (the experts of a
  mixture, for routing): ``observation.module``, ``args``, ``kwargs``, its
  output ``outputs`` and ``units`` (how many experts it dispatches to), with the
  block's hidden states ``block_inputs`` and ``block_outputs`` (the call is
  folded in once the block's forward is over).

A statistic is registered by name (:mod:`prunereg._runtime.registry`), and a
method asks for it by that name in its ``STATISTICS``; what the engine hands
the method carries its result (``statistics["name"]``, :class:`ReadByName`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

from prunereg._plugins.isolation import guard_plugin_methods

#: Where a statistic is observed.
SITES = ("layer_input", "block", "module_call")


class Observation:
    """One calibration batch at one site, as :meth:`Statistic.fold` takes it in.

    ``batch`` is the batch's index in the calibration set (0 where the run
    does not count batches). ``inputs`` is what the site reads: the group's
    input (``layer_input``), the block's input hidden states (``block``) or the
    call's first argument (``module_call``); ``outputs`` the block's output
    hidden states (``block``) or what the module returned (``module_call``).
    """

    __slots__ = (
        "_rows",
        "args",
        "batch",
        "block_inputs",
        "block_outputs",
        "inputs",
        "kwargs",
        "module",
        "outputs",
        "units",
    )

    def __init__(
        self,
        batch: int,
        inputs: Tensor | None,
        outputs: Tensor | None = None,
        *,
        module: nn.Module | None = None,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        units: int | None = None,
        block_inputs: Tensor | None = None,
        block_outputs: Tensor | None = None,
    ) -> None:
        self.batch = batch
        self.inputs = inputs
        self.outputs = outputs
        self.module = module
        self.args = args
        self.kwargs: Mapping[str, Any] = kwargs if kwargs is not None else {}
        self.units = units
        self.block_inputs = block_inputs
        self.block_outputs = block_outputs
        self._rows: Tensor | None = None

    def rows(self) -> Tensor:
        """``inputs`` as float32 ``[tokens, features]`` (every leading index one token), made once per observation."""
        if self._rows is None:
            if self.inputs is None:
                raise ValueError("this observation has no input tensor")
            self._rows = self.inputs.detach().reshape(-1, self.inputs.shape[-1]).float()
        return self._rows

    def n_tokens(self) -> int:
        """How many tokens ``inputs`` holds (every leading index one token; 0 without inputs)."""
        inputs = self.inputs
        if inputs is None or inputs.dim() == 0:
            return 0
        return inputs.numel() // inputs.shape[-1] if inputs.shape[-1] else 0


class Statistic(ABC):
    """A statistic of calibration activations, folded in batch by batch.

    Subclasses set ``NAME`` (how methods ask for it) and ``SITE`` (one of
    :data:`SITES`), take no constructor arguments (an empty statistic), and
    implement :meth:`fold`, :meth:`combine` and :meth:`result`. Register one
    with ``prunereg.toolkit.register_statistic``. Everything runs without
    autograd, with torch's float32 matmul at full precision.
    """

    NAME: ClassVar[str] = ""
    SITE: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # A third-party statistic runs as plugin code: sys.exit() in it is an error, its prints go to stderr.
        guard_plugin_methods(cls, ("__init__", "fold", "combine", "result"))

    @abstractmethod
    def fold(self, observation: Observation) -> None:
        """Take in one calibration batch (leaving ``observation``'s tensors unchanged)."""

    @abstractmethod
    def combine(self, other: Statistic) -> None:
        """Take in ``other`` (the same statistic over other batches), in place, as if its batches followed this one's.

        Exact and in a fixed order, so that ranks can combine their partial
        results: sums add, moments merge with their counts (never a mean of
        means), and ``other`` is left unchanged. Every run uses it: each batch
        is folded into an empty statistic of its own, and the batches' partial
        results are combined along one fixed tree over the batch indices
        (:mod:`prunereg._runtime.pairwise`), in one process as over ranks.
        """

    @abstractmethod
    def result(self) -> Any:
        """What a method reads (None where nothing was folded in)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def same_kind(other: Statistic, kind: type[Statistic]) -> Any:
    """``other``, refused with a TypeError unless it is the same statistic (combine takes its own kind only)."""
    if not isinstance(other, kind):
        raise TypeError(f"{kind.__name__} combines with another {kind.__name__}, not {type(other).__name__}")
    return other


class ReadByName:
    """Statistics handed to a method, which also reads those without a field of their own by name.

    ``statistics["input_covariance"]`` is the result of a registered statistic
    the method asked for in its ``STATISTICS`` (``extra`` holds them all).
    """

    extra: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        try:
            return self.extra[name]
        except KeyError:
            known = ", ".join(sorted(self.extra)) or "none"
            raise KeyError(f"no statistic {name!r} was gathered here (these were: {known})") from None
