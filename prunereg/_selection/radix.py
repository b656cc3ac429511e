"""The radix-select engine: the k-th smallest (or largest) of many scores, without sorting.

Each score becomes a signed integer key with the same order (:func:`order_keys`:
the float's bits, negatives mirrored, NaN the lowest key, ``-0.0`` equal to
``0.0``), and :func:`find_threshold` finds the k-th key by a radix select: a
65536-bin histogram of the keys' top 16 bits says which bin holds the k-th
entry, a histogram of the next 16 bits of the entries in that bin refines it,
and so on (one pass for 16-bit keys, two for float32, four for float64). With
``two_pass=True`` a bin holding at most 1/16 of the keys stops the search after
the first pass: the marking pass collects that bin's entries and
:meth:`Marker.finish` settles them, so float32 and float64 cost two passes.

The selected entries are those strictly below the threshold key (above it for
``largest=True``), plus as many entries *equal* to it as needed to make exactly
k, taken in stream order: the first block first, and within a block by
increasing position.

The engine knows neither where keys come from nor how many processes hold
them. :func:`find_threshold` asks ``key_blocks()`` for the keys once per pass
(the callable must yield the same keys in the same order each time; a block may
be overwritten once the next is asked for, so keys may live in a
:class:`Workspace`) and keeps only 65536 counts. A caller whose entries are
spread over processes runs the same search on every process over its own
entries, with the global ``k``, and passes two collectives:

- ``all_reduce(counts)`` is applied to every histogram (an int64 tensor of 65536
  counts on ``device``) before it is used, e.g. a SUM ``dist.all_reduce`` that
  returns its argument; every process then walks the same global histogram, takes
  the same branches and finds the same threshold.
- ``exclusive_prefix(local_ties)`` gets a one-element int64 tensor, the number of
  this process's entries equal to the threshold key, and returns how many tied
  entries precede them in the global order (an exclusive prefix sum over ranks,
  rank 0 first). The result is :attr:`Threshold.offset`, and :class:`Marker`
  starts counting ties there, so the processes together select exactly k.

Then ``mark = Marker(threshold, all_reduce=..., exclusive_prefix=...)`` selects
block after block, in the same order (``mark(keys, out=...)``, a bool tensor),
and ``mark.finish()``, called on every process after its last block (it runs a
search of its own over the collected entries, with the same collectives),
lists the further ``(block number, positions)`` to select. Without
``two_pass`` it returns an empty list.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable, Sequence

import torch

_DIGIT = 16
_BINS = 1 << _DIGIT

# float dtype -> (integer view dtype, bits of its largest finite magnitude + 1 = +inf)
_FLOAT_VIEWS = {
    torch.float16: (torch.int16, 0x7C00),
    torch.bfloat16: (torch.int16, 0x7F80),
    torch.float32: (torch.int32, 0x7F800000),
    torch.float64: (torch.int64, 0x7FF0000000000000),
}
# integer dtype -> key dtype (keys are signed and at least 16 bits wide)
_INT_KEYS = {
    torch.bool: torch.int16,
    torch.uint8: torch.int16,
    torch.int8: torch.int16,
    torch.int16: torch.int16,
    torch.int32: torch.int32,
    torch.int64: torch.int64,
}
_WIDTH = {torch.int16: 16, torch.int32: 32, torch.int64: 64}


def key_dtype(dtype: torch.dtype) -> torch.dtype | None:
    """The integer dtype of :func:`order_keys` for scores of ``dtype`` (None: not supported, use topk)."""
    view = _FLOAT_VIEWS.get(dtype)
    return view[0] if view is not None else _INT_KEYS.get(dtype)


def key_width(dtype: torch.dtype) -> int:
    """Bits of the keys of scores of ``dtype``: 16, 32 or 64."""
    keys = key_dtype(dtype)
    if keys is None:
        raise TypeError(f"no order-preserving integer keys for {dtype}")
    return _WIDTH[keys]


def order_keys(scores: torch.Tensor, *, magnitude: bool = False, workspace: Workspace | None = None) -> torch.Tensor:
    """Signed integer keys, one per entry of ``scores`` (flattened), in the scores' order.

    Floats: ``-0.0`` and ``0.0`` get the same key, NaN gets the lowest key of the
    dtype (below ``-inf``). Non-negative finite floats (uniform draws) are their
    own keys: the bits are returned as a view, without a copy. ``magnitude``:
    keys of ``torch.abs(scores)`` (one masking of the sign bit for floats).
    Computed keys live in ``workspace`` (if given) until its next use.
    """
    workspace = workspace if workspace is not None else Workspace()
    return flat_order_keys(scores.reshape(-1), magnitude, workspace, clean=False)[0]


def flat_order_keys(
    flat: torch.Tensor, magnitude: bool, workspace: Workspace, *, clean: bool
) -> tuple[torch.Tensor, bool]:
    """:func:`order_keys` of flat scores, and whether they were clean: no NaN, and no negative
    value unless ``magnitude``. ``clean=True`` (an earlier pass found them so) skips the checks."""
    view = _FLOAT_VIEWS.get(flat.dtype)
    if view is None:
        keys_dtype = _INT_KEYS.get(flat.dtype)
        if keys_dtype is None:
            raise TypeError(f"no order-preserving integer keys for {flat.dtype}")
        if magnitude:
            flat = flat.abs()  # as torch.abs, wrap-around of the lowest value included
        return (flat if flat.dtype == keys_dtype else workspace.like("keys", flat, keys_dtype).copy_(flat)), True
    int_dtype, inf_bits = view
    bits = flat.view(int_dtype)
    if bits.numel() == 0:
        return bits, True
    width = _WIDTH[int_dtype]
    lowest = torch.iinfo(int_dtype).min
    if magnitude:
        keys = torch.bitwise_and(bits, (1 << (width - 1)) - 1, out=workspace.like("keys", bits))
        if clean or int(keys.max()) <= inf_bits:
            return keys, True
        return keys.masked_fill_(torch.gt(keys, inf_bits, out=workspace.like("nan", keys, torch.bool)), lowest), False
    if clean:
        return bits, True
    low, high = (int(v) for v in torch.aminmax(bits))
    if low >= 0 and high <= inf_bits:
        return bits, True
    sign = torch.bitwise_right_shift(bits, width - 1, out=workspace.like("sign", bits))  # 0 or -1
    keys = torch.bitwise_and(bits, (1 << (width - 1)) - 1, out=workspace.like("keys", bits))  # magnitude
    nan = torch.gt(keys, inf_bits, out=workspace.like("nan", keys, torch.bool))
    keys.bitwise_xor_(sign).sub_(sign)  # two's complement negation where negative
    return keys.masked_fill_(nan, lowest), False


class Workspace:
    """Scratch tensors that every block and pass of one search writes into again.

    Large temporaries allocated and freed block after block are returned to the
    kernel and page-faulted back each time (glibc, Linux): on these machines that
    costs more than the arithmetic. Reusing them pays it once.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The 1-D tensor named ``name``, of ``numel`` entries (grown when too small)."""
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype or buffer.device != device:
            size = max(numel, buffer.numel() if buffer is not None else 0)
            buffer = torch.empty(size, dtype=dtype, device=device)
            self._buffers[name] = buffer
        return buffer[:numel]

    def like(self, name: str, tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """:meth:`take` with ``tensor``'s number of entries, device and (unless given) dtype."""
        return self.take(name, tensor.numel(), dtype or tensor.dtype, tensor.device)

    def converted(self, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``tensor.to(dtype)``, flattened, in reused memory (``tensor`` itself if it has that dtype)."""
        if tensor.dtype == dtype:
            return tensor
        return self.like("converted", tensor, dtype).copy_(tensor.reshape(-1))


@dataclasses.dataclass(frozen=True)
class Threshold:
    """Where the k-th key lies, and how the entries of its bin are shared out.

    The bin is the keys ``key .. key + span - 1``: one key once the search is
    exact (``span`` 1), the keys sharing their top 16 bits after a two-pass
    search's first pass. All entries below the bin (above it when ``largest``)
    are selected: there are ``before`` of them, in all processes. Of the
    ``ties`` entries in the bin, ``take`` are selected: when exact, the first in
    stream order, ``offset`` of which precede this process's entries; otherwise
    as :meth:`Marker.finish` decides.
    """

    key: int
    largest: bool
    before: int
    take: int
    ties: int
    width: int
    span: int = 1
    offset: int = 0


def find_threshold(
    key_blocks: Callable[[], Iterable[torch.Tensor]],
    k: int,
    *,
    width: int,
    largest: bool = False,
    two_pass: bool = False,
    device: torch.device | str | None = None,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    exclusive_prefix: Callable[[torch.Tensor], torch.Tensor] | None = None,
    workspace: Workspace | None = None,
) -> Threshold:
    """Find the threshold of the ``k`` smallest (largest) keys by radix select, without sorting.

    ``key_blocks()`` is called once per 16 bits of ``width`` and must yield 1-D
    integer key tensors (:func:`order_keys`) in the same order every time; only
    one block at a time and 65536 counts are held. ``k`` must lie in
    ``[1, number of keys]``.

    ``two_pass``: stop after the first 16 bits when their bin holds at most
    1/16 of the keys (wider keys only); the marking pass then also collects that
    bin's entries and :meth:`Marker.finish` settles them, which saves the
    passes over all keys that the other digits would cost.

    ``device`` holds the counts (default: the first block's device).
    ``all_reduce`` and ``exclusive_prefix``: see the module docstring.
    ``workspace`` holds the per-block temporaries (its names ``top``, ``wide``
    and ``digits``; the keys may live in the same workspace).
    """
    if width % _DIGIT or width <= 0:
        raise ValueError(f"key width must be a positive multiple of {_DIGIT}, got {width}")
    workspace = workspace if workspace is not None else Workspace()
    prefix = 0
    before = 0
    for level in range(width // _DIGIT):
        shift = width - _DIGIT * (level + 1)
        summed: torch.Tensor | None = None
        for keys in key_blocks():
            counts = _digit_counts(keys, shift, None if level == 0 else prefix, workspace)
            if summed is None:
                summed = counts.to(device) if device is not None else counts
            else:
                summed += counts.to(summed.device)
        local = summed if summed is not None else torch.zeros(_BINS, dtype=torch.int64, device=device)
        merged = all_reduce(local.clone()) if all_reduce is not None else local
        digit, skipped = _walk(merged, k - before, largest)
        before += skipped
        prefix = digit - _BINS // 2 if level == 0 else (prefix << _DIGIT) | digit
        ties = int(merged[digit])
        if level == 0 and shift and two_pass and ties * 16 <= int(merged.sum()):
            return Threshold(prefix << shift, largest, before, k - before, ties, width, span=1 << shift)
    offset = 0
    if exclusive_prefix is not None:
        offset = int(exclusive_prefix(local[digit : digit + 1].clone()))
    return Threshold(prefix, largest, before, k - before, ties, width, offset=offset)


class Marker:
    """Selects, block after block in stream order, the entries a :class:`Threshold` chooses.

    After a two-pass search, the entries of the threshold's bin are collected
    as the blocks go by; :meth:`finish` then says which of them are selected too.
    """

    def __init__(
        self,
        threshold: Threshold,
        workspace: Workspace | None = None,
        *,
        device: torch.device | str | None = None,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
        exclusive_prefix: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.threshold = threshold
        self.ties_seen = threshold.offset
        self.workspace = workspace if workspace is not None else Workspace()
        self.device = device
        self.all_reduce = all_reduce
        self.exclusive_prefix = exclusive_prefix
        self.blocks = 0
        self.candidates: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (block, positions, keys)

    def __call__(self, keys: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The bool selection of ``keys`` (the next block), written to ``out`` if given."""
        t = self.threshold
        block, self.blocks = self.blocks, self.blocks + 1
        last = t.key + t.span - 1
        if t.take == t.ties:  # the whole bin is selected
            return torch.ge(keys, t.key, out=out) if t.largest else torch.le(keys, last, out=out)
        selected = torch.gt(keys, last, out=out) if t.largest else torch.lt(keys, t.key, out=out)
        if t.span > 1:
            # (keys up to the bin's end) XOR (keys below it): the bin's entries.
            reach = (
                torch.ge(keys, t.key, out=self.workspace.like("equal", keys, torch.bool))
                if t.largest
                else (torch.le(keys, last, out=self.workspace.like("equal", keys, torch.bool)))
            )
            positions = reach.bitwise_xor_(selected).nonzero().squeeze(1)
            if positions.numel():
                self.device = self.device or keys.device
                self.candidates.append((block, positions, keys[positions]))
            return selected
        wanted = t.take - self.ties_seen
        if wanted <= 0:
            return selected
        equal = torch.eq(keys, t.key, out=self.workspace.like("equal", keys, torch.bool))
        count = int(torch.count_nonzero(equal))
        if count <= wanted:
            selected |= equal
        else:
            end = _position_of_true(equal, wanted) + 1
            selected[:end] |= equal[:end]
        self.ties_seen += min(count, wanted)
        return selected

    def finish(self) -> list[tuple[int, torch.Tensor]]:
        """After the last block: the entries of a two-pass threshold's bin that are selected too.

        A list of (block number, counted from 0 in the order the blocks were
        marked; flat positions within that block). Empty for an exact threshold.
        Distributed callers call it on every process: it runs a search of its own
        over the collected entries with the same ``all_reduce`` and ``exclusive_prefix``.
        """
        t = self.threshold
        if t.span == 1 or t.take == t.ties:
            return []
        collected = [keys for _, _, keys in self.candidates]
        exact = find_threshold(
            lambda: iter(collected),
            t.take,
            width=t.width,
            largest=t.largest,
            device=self.device,
            all_reduce=self.all_reduce,
            exclusive_prefix=self.exclusive_prefix,
            workspace=self.workspace,
        )
        mark = Marker(exact, self.workspace)
        return [(block, positions[mark(keys)]) for block, positions, keys in self.candidates]


def _digit_counts(keys: torch.Tensor, shift: int, prefix: int | None, workspace: Workspace) -> torch.Tensor:
    """Histogram (65536 int64 counts) of the 16-bit digit of ``keys`` at ``shift``.

    ``prefix`` None: the most significant digit, signed, offset by 32768 so that
    bins go in key order. Otherwise only keys whose higher bits equal ``prefix``
    count; the others are clamped into two spill bins and dropped, which is much
    cheaper than selecting the matching keys first.
    """
    if keys.numel() == 0:
        return torch.zeros(_BINS, dtype=torch.int64, device=keys.device)
    if prefix is None:
        return _top_digit_counts(keys, workspace)
    # XOR with the prefix (no overflow possible) leaves the digit of matching
    # keys in [0, 65535] and puts every other key outside it.
    high = prefix << _DIGIT
    digits = workspace.like("digits", keys)
    if shift:
        torch.bitwise_right_shift(keys, shift, out=digits).bitwise_xor_(high)
    else:
        torch.bitwise_xor(keys, high, out=digits)
    spilled = torch.bincount(digits.clamp_(-1, _BINS).add_(1), minlength=_BINS + 2)
    return spilled[1:-1]


def _top_digit_counts(keys: torch.Tensor, workspace: Workspace) -> torch.Tensor:
    """Histogram of the top 16 bits of ``keys``, signed, in bins offset by 32768."""
    if keys.dtype == torch.int16:
        top = keys
    else:
        # The top 16 bits are every (width/16)-th int16 of the keys' memory:
        # one strided copy instead of a shift of the whole width.
        per_key = keys.element_size() // 2
        halves = keys.view(torch.int16)
        strided = halves[per_key - 1 :: per_key] if sys.byteorder == "little" else halves[::per_key]
        top = workspace.like("top", strided).copy_(strided)
    if int(top.min()) >= 0:
        # Non-negative keys (magnitudes, draws): count them as they are, without
        # widening, into the upper half of the bins.
        counts = torch.zeros(_BINS, dtype=torch.int64, device=keys.device)
        counts[_BINS // 2 :] = torch.bincount(top, minlength=_BINS // 2)
        return counts
    wide = workspace.like("wide", top, torch.int32).copy_(top).add_(_BINS // 2)
    return torch.bincount(wide, minlength=_BINS)


def _walk(counts: torch.Tensor, k: int, largest: bool) -> tuple[int, int]:
    """The bin holding the k-th entry (from the low end, or the high one) and the entries before it."""
    ordered = counts.flip(0) if largest else counts
    cumulative = ordered.cumsum(0).cpu()
    total = int(cumulative[-1])
    if not 1 <= k <= total:
        raise ValueError(f"cannot select {k} more entries of a histogram of {total}")
    position = int(torch.searchsorted(cumulative, k))
    skipped = int(cumulative[position - 1]) if position else 0
    return (_BINS - 1 - position if largest else position), skipped


def _position_of_true(flags: torch.Tensor, n: int) -> int:
    """Index of the ``n``-th True entry (from 1) of the 1-D ``flags``, which has at least ``n``."""
    start = 0
    for piece in flags.split(1 << 20):
        here = int(torch.count_nonzero(piece))
        if here >= n:
            return start + int(piece.nonzero()[n - 1])
        n -= here
        start += piece.numel()
    raise ValueError("fewer True entries than asked for")


def promoted_dtype(tensors: Sequence[torch.Tensor]) -> torch.dtype:
    """The dtype ``torch.cat(tensors)`` would have."""
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype
