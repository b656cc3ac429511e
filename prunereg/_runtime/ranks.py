"""Calibration split over the ranks of ``torch.distributed``: each rank's batches, the statistics of all, one error.

When a process group is initialized (``torchrun``), each rank runs the
calibration forwards of a contiguous range of the batches (:meth:`Ranks.share`)
and :meth:`Ranks.merge` hands every rank the statistics of all of them,
combined in rank order along the recorder's fixed tree over the batches: the
same bits as one process over every batch, on every rank. Every collective is
one :meth:`Ranks.exchange` (an ``all_gather_object``), which also carries a
failure, or follows one (the broadcasts of large payloads, one source rank at a
time, after an exchange of their sizes): a rank whose run raises inside
:func:`together` sends its error to the others' next exchange, so every rank stops with one error instead of waiting
for a collective that never comes (a rank that dies is the process group's
timeout to catch). The ranks are one job's processes, trusted as torch trusts them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from prunereg._bytes import tensor_buffer
from prunereg._runtime.pairwise import Span
from prunereg._runtime.recorder import Partial, Recorder, Tally
from prunereg._text import describe

_OK, _FAILED = "ok", "failed"

_R = TypeVar("_R")


class RankFailed(RuntimeError):
    """Another rank's run raised: this rank stops too, with that rank's error."""


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks of the default process group."""

    rank: int
    size: int

    @classmethod
    def current(cls, enabled: bool = True) -> Ranks | None:
        """The ranks of the initialized default process group, or None (not initialized, or not ``enabled``)."""
        if not enabled:
            return None
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        return cls(dist.get_rank(), dist.get_world_size())

    def share(self, n_batches: int) -> range:
        """This rank's batches: a contiguous range, the ranks' ranges in rank order covering ``range(n_batches)``."""
        return range(n_batches * self.rank // self.size, n_batches * (self.rank + 1) // self.size)

    def exchange(self, payload: Any) -> list[Any]:
        """Every rank's ``payload``, in rank order; :class:`RankFailed` where a rank sent its failure instead."""
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.size
        dist.all_gather_object(gathered, (_OK, payload))
        for rank, (status, value) in enumerate(gathered):
            if status == _FAILED:
                raise RankFailed(f"rank {rank} of {self.size} failed: {value}")
        return [value for _, value in gathered]

    def _each_loaded(self, payload: Callable[[], Any], take: Callable[[Any], None], *, weights_only: bool) -> None:
        """Every rank's ``payload()`` (tensors in objects), ``torch.save``-d and loaded one source rank at a time.

        ``take(loaded)`` gets them in rank order, CUDA tensors on this
        rank's GPU (``all_gather_object`` alone would unpickle them on the
        sender's); each is dropped before the next is received. This rank's
        payload is built, serialized and let go before anything is exchanged,
        and its own turn loads it back from its bytes (the same bits:
        ``torch.save`` keeps tensors' values and which share storage), so
        ``take`` never combines into the caller's objects, and a rank holds its
        own payload's bytes and one other rank's, not every rank's at once, nor
        its own objects beside their bytes.
        ``weights_only=False`` is for payloads of this job's own classes (the
        ranks trust each other as torch does). One fail-aware :meth:`exchange`
        of the sizes comes first, then one ``broadcast`` per rank; if ``take``
        raises, this rank still receives the rest (no collective is left
        unmatched) and then raises, for :func:`together` to tell the others.
        """
        buffer = io.BytesIO()
        torch.save(payload(), buffer)
        sizes = self.exchange(buffer.getbuffer().nbytes)
        own = [buffer]  # emptied at this rank's own turn: its bytes are needed no longer
        del buffer
        here = _this_gpu()
        error: Exception | None = None
        for source, size in enumerate(sizes):
            if source == self.rank:
                received = own.pop()
                _send(received, source)
                received.seek(0)
            else:
                received = _receive(source, size)
            if error is None:
                try:
                    take(torch.load(received, map_location=here, weights_only=weights_only))
                except Exception as raised:
                    error = raised
            del received
        if error is not None:
            raise error

    def merged(self, tally: Tally) -> Tally:
        """``tally`` over every rank's batches, combined in rank order; only tensors and numbers cross between ranks.

        Each statistic in it must be :class:`~prunereg._runtime.recorder.Stateful`
        (a fit that holds a callable: the callable stays on each rank).
        """
        merged = Tally(tally.factories)

        def take(loaded: tuple[int, list[tuple[int, int, Any]]]) -> None:
            n_tokens, spans = loaded
            merged.extend(n_tokens, [Span(level, i, Partial.from_state(tally.factories, s)) for level, i, s in spans])

        def mine() -> tuple[int, list[tuple[int, int, Any]]]:
            return tally.n_tokens, [(span.level, span.index, span.value.state()) for span in tally.spans()]

        self._each_loaded(mine, take, weights_only=True)
        return merged

    def solve_spread(self, costs: Sequence[float], solve: Callable[[int], _R]) -> list[_R]:
        """Every item's ``solve(index)``, each solved on one rank (:func:`owners`) and sent to every rank.

        ``solve`` must give tensors and numbers in tuples, lists and dicts
        (exchanged with ``weights_only``: no code crosses between ranks). The
        results are the owner's, bit for bit, so they equal one process's
        wherever ``solve`` is a function of its item (the same code, inputs and thread count on every rank).
        """
        owner = owners(costs, self.size)
        solved: dict[int, _R] = {}
        self._each_loaded(
            lambda: {index: solve(index) for index, rank in enumerate(owner) if rank == self.rank},
            solved.update,
            weights_only=True,
        )
        return [solved[index] for index in range(len(owner))]

    def fail(self, error: BaseException) -> None:
        """Send ``error`` to the other ranks' next exchange (best effort: a rank gone already cannot hear it)."""
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            dist.all_gather_object([None] * self.size, (_FAILED, describe(error)))

    def agree(self, what: str, fingerprint: Mapping[str, str]) -> None:
        """Refuse, on every rank alike, ranks whose ``fingerprint`` (what must match, by name) differs from rank 0's."""
        everyone = self.exchange(dict(fingerprint))
        for name in fingerprint:
            differing = [rank for rank, theirs in enumerate(everyone) if theirs.get(name) != everyone[0].get(name)]
            if differing:
                ranks = ", ".join(map(str, differing))
                raise ValueError(
                    f"{what}: the ranks disagree on the {name} (rank {ranks} of {self.size} differs from rank 0); "
                    "give every rank the same model, method, settings and calibration samples"
                )

    def merge(self, recorder: Recorder) -> None:
        """Give ``recorder`` every rank's statistics, combined in rank order (the same on every rank).

        Input groups are matched by their layer names, in the order the ranks
        found them (rank 0's first): an expert no token of a rank reached is
        in that rank's groups only.
        """

        def mine() -> tuple[list[Any], dict[str, Any], tuple[int, list[Any]]]:
            # Handed over whole: once serialized, this rank's partials are held by nothing (the recorder gets
            # the merged statistics at the end), so they are gone while the other ranks' arrive.
            parts = (
                [(names, _parts(tally)) for names, tally in zip(recorder.groups, recorder.tallies, strict=True)],
                {name: _parts(tally) for name, tally in recorder.called.items()},
                _parts(recorder.block),
            )
            recorder.groups, recorder.tallies, recorder.called = [], [], {}
            recorder.block = Tally(recorder.block_statistics)
            return parts

        groups: list[list[str]] = []
        tallies: list[Tally] = []
        called = {name: Tally(recorder.call_statistics) for name in recorder.called}
        block = Tally(recorder.block_statistics)
        where: dict[tuple[str, ...], int] = {}

        def take(loaded: tuple[list[Any], dict[str, Any], tuple[int, list[Any]]]) -> None:
            rank_groups, rank_called, rank_block = loaded
            for names, parts in rank_groups:
                if tuple(names) not in where:
                    where[tuple(names)] = len(groups)
                    groups.append(list(names))
                    tallies.append(Tally(recorder.layer_statistics))
                tallies[where[tuple(names)]].extend(*parts)
            for name, parts in rank_called.items():
                called[name].extend(*parts)
            block.extend(*rank_block)

        self._each_loaded(mine, take, weights_only=False)  # the job's own ranks: trusted
        recorder.groups, recorder.tallies, recorder.called, recorder.block = groups, tallies, called, block


def owners(costs: Sequence[float], size: int) -> list[int]:
    """The rank that solves each item: the costliest first, each to the rank with the least cost so far.

    Ties go to the earlier item and the lower rank, so every rank computes the
    same assignment from the same ``costs`` (one item per rank where they are as many).
    """
    load, count = [0.0] * size, [0] * size
    owner = [0] * len(costs)
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(size), key=lambda r: (load[r], count[r], r))
        owner[index] = rank
        load[rank] += costs[index]
        count[rank] += 1
    return owner


def _send(serialized: io.BytesIO, source: int) -> None:
    """This rank's (``source``'s) serialized bytes to every other rank: one ``broadcast`` of them as ``uint8``."""
    import torch.distributed as dist

    dist.broadcast(torch.frombuffer(serialized.getbuffer(), dtype=torch.uint8).to(_group_device()), source)


def _receive(source: int, size: int) -> io.BytesIO:
    """Rank ``source``'s ``size`` serialized bytes, from its :func:`_send`."""
    import torch.distributed as dist

    received = torch.empty(size, dtype=torch.uint8, device=_group_device())
    dist.broadcast(received, source)
    return io.BytesIO(bytes(tensor_buffer(received)))


def _group_device() -> torch.device:
    """Where the process group's collectives take tensors: this rank's GPU for NCCL, the CPU otherwise."""
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _this_gpu() -> dict[str, str] | None:
    """A ``map_location`` that puts tensors from any GPU on this process's current one (None without CUDA)."""
    if not torch.cuda.is_available():
        return None
    here = f"cuda:{torch.cuda.current_device()}"
    return {f"cuda:{index}": here for index in range(torch.cuda.device_count())}


def _parts(tally: Tally) -> tuple[int, list[Any]]:
    return tally.n_tokens, tally.spans()


@contextlib.contextmanager
def launched_group(device: str | None) -> Iterator[None]:
    """Around a command: the process group ``torchrun`` asks for (its ``RANK``, ``WORLD_SIZE``, ...), if none is up.

    NCCL where ``device`` is CUDA (each rank on its ``LOCAL_RANK``'s GPU), gloo
    otherwise; destroyed at the end. Outside ``torchrun`` (or on one rank) nothing happens.
    """
    import torch.distributed as dist

    launched = all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
    if not launched or int(os.environ["WORLD_SIZE"]) < 2 or not dist.is_available() or dist.is_initialized():
        yield
        return
    cuda = device is not None and torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    _import_modules_that_pin_the_group()
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()


def _import_modules_that_pin_the_group() -> None:
    """Import, before the group exists, the torch modules whose defaults would hold it past its destruction.

    ``torch.distributed.fsdp`` (imported by ``torch._dynamo``, so by loading a
    transformers model) takes ``dist.group.WORLD`` as a default argument when it
    is first imported. Imported inside the group, it keeps the group alive after
    ``destroy_process_group``: gloo's threads then outlive the interpreter and
    now and then abort the process at exit ("terminate called without an active
    exception"), a failed command after its output was written.
    """
    import torch.distributed.fsdp  # noqa: F401


@contextlib.contextmanager
def together(ranks: Ranks | None) -> Iterator[None]:
    """Around one rank's whole run: its failure reaches every rank, and no rank ends while another failed.

    A rank whose run raises sends the error to the others (their next
    exchange raises :class:`RankFailed`) and re-raises it; a run that ends
    well ends with one more exchange, so a rank that failed after the last
    collective still stops every rank. Without ranks this does nothing.
    """
    if ranks is None:
        yield
        return
    try:
        yield
    except RankFailed:
        raise
    except BaseException as error:
        if not getattr(error, _SENT, False):  # an inner run sent it already: the others hear it once
            with contextlib.suppress(AttributeError):
                setattr(error, _SENT, True)
            ranks.fail(error)
        raise
    ranks.exchange(None)


#: The attribute that marks an error sent to the other ranks already.
_SENT = "_prunereg_sent_to_ranks"


def digest(*parts: object) -> str:
    """A short hash of ``parts`` (their ``repr``; tensors by their bytes), for fingerprints that ranks compare."""
    hashed = hashlib.sha256()
    for part in parts:
        if isinstance(part, Tensor):
            hashed.update(repr((part.dtype, tuple(part.shape))).encode())
            hashed.update(tensor_buffer(part))
        else:
            hashed.update(repr(part).encode())
        hashed.update(b"\0")
    return hashed.hexdigest()[:16]


def fingerprint(model: nn.Module, method: object, settings: object, batches: Sequence[Tensor]) -> dict[str, str]:
    """What every rank's run must share, hashed: the model's shapes, the settings, the method, the samples.

    ``settings`` is an engine's settings dataclass; ``progress`` and
    ``restore_on_error`` may differ between ranks. ``method`` is compared by
    its class and attributes.
    """
    shared = [
        (name, _described(value))
        for name, value in vars(settings).items()
        if name not in ("progress", "restore_on_error")
    ]
    return {
        "model": model_digest(model),
        "settings": digest(shared),
        "method": digest(_described(method)),
        "calibration samples": digest(len(batches), *batches),
    }


def _described(value: object) -> object:
    """``value`` as ranks compare it: a method (a setting may hold one: ``recover=``) by its class and attributes."""
    if value is None or isinstance(value, (str, int, float, bool, tuple, list, dict, frozenset)):
        return value
    return (type(value).__module__, type(value).__qualname__, sorted(vars(value).items()))


def own_batches(ranks: Ranks | None, batches: Sequence[Tensor]) -> tuple[list[Tensor], int]:
    """This rank's share of ``batches`` and the index of its first one (all of them from 0 without ranks)."""
    share = ranks.share(len(batches)) if ranks is not None else range(len(batches))
    return list(batches[share.start : share.stop]), share.start


def model_digest(model: nn.Module) -> str:
    """A hash of ``model``'s class and of its parameters' and buffers' names, shapes and dtypes (not their values)."""
    tensors: Iterable[tuple[str, Tensor]] = [*model.named_parameters(), *model.named_buffers()]
    return digest(type(model).__qualname__, [(name, tuple(t.shape), str(t.dtype)) for name, t in tensors])
