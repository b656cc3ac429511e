"""Global pruning: one threshold over many tensors, as if they were one.

torch concatenates every weight, mask and score (about 12x the weights' bytes at
peak) and leaves a concatenated mask alive. Here the methods that declare how
they rank entries (``RANKED_BY``: the built-in L1 and random methods, and any
third-party method that does the same) stream: the threshold search of
:mod:`prunereg._selection.radix` runs over the parameters block by block, so besides the new masks only one block's
temporaries are alive at a time, and each parameter keeps only its own mask.
Random draws are those of torch (``rand`` of the remaining entries, in the
promoted dtype, on the first tensor's device): on CPU a run of draws block by
block gives the same numbers, so each pass restores the generator state and
draws again instead of keeping them; on other devices they are drawn once.
Other methods, and small inputs (where ``topk`` decides, as in torch), see the
remaining entries concatenated, as torch does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from prunereg._core import compact, reparam
from prunereg._core import tied as _tied
from prunereg._core.custom import CustomFromMask
from prunereg._core.method import BasePruningMethod, install_mask
from prunereg._distributed import global_shares
from prunereg._distributed.global_shares import Entry
from prunereg._distributed.layout import is_dtensor, local_shard
from prunereg._distributed.vectors import SpreadVector
from prunereg._plugins.loading import registry
from prunereg._selection import radix, select
from prunereg._selection.amount import nparams_to_prune, validate_amount
from prunereg._selection.threads import bounded_threads

if TYPE_CHECKING:
    from torch import nn

Parameter = tuple["nn.Module", str]


def global_unstructured(
    parameters: Iterable[Parameter],
    pruning_method: type[BasePruningMethod] | str,
    importance_scores: dict[Parameter, torch.Tensor] | None = None,
    **kwargs: Any,
) -> None:
    """Prune ``parameters`` together with one ``"unstructured"`` method, as torch does.

    The method sees the entries of all tensors that are still unpruned as one
    vector; each tensor then gets its share of the mask through ``custom_from_mask``.
    Unlike torch, the tensors may live on different devices (meta included),
    ``parameters`` may be a generator, memory stays bounded (see the module
    docstring) and no concatenated mask stays alive. All tensors are pruned or,
    on any error, none. As with ``apply``, a name may be dotted, relative to
    any ancestor (``(model, "lm_head.weight")``): a parameter tied to others
    under that ancestor is then pruned with the same mask everywhere; one held
    by a module outside the module given is refused (ValueError naming it).
    ``pruning_method`` may also be a registered name (``"l1_unstructured"``),
    as :func:`prunereg.get` takes it. Each tensor's hook is a
    ``CustomFromMask`` as in torch, which remembers the method
    (``chosen_by``), so :func:`prunereg.summary` names ``l1_unstructured``.
    """
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    importance_scores = importance_scores if importance_scores is not None else {}
    if not isinstance(importance_scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    parameters = list(parameters)
    if isinstance(pruning_method, str):
        pruning_method = registry().resolve(pruning_method)
    if not (isinstance(pruning_method, type) and issubclass(pruning_method, BasePruningMethod)):
        raise TypeError(
            f"global_unstructured(): pruning_method must be a BasePruningMethod subclass, got {pruning_method!r}"
        )
    method = pruning_method(**kwargs)
    method._tensor_name = "temp"
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(
            'Only "unstructured" PRUNING_TYPE supported for the `pruning_method`. '
            f"Found method {pruning_method} of type {method.PRUNING_TYPE}"
        )
    if not parameters:
        # torch fails here too (ValueError from torch.cat); silently pruning
        # nothing would hide an exhausted generator.
        raise ValueError("global_unstructured(): parameters is empty")

    groups = [_tied.sites(module, name) for module, name in parameters]
    for group in groups:
        if len(group) == 1:
            _tied.refuse_splitting(group[0])
    _tied.refuse_holders_outside([(module, group) for (module, _), group in zip(parameters, groups)])
    targets = [(group[0].module, group[0].name) for group in groups]
    tensors = [getattr(module, name) for module, name in targets]
    scores = [_scores_for(importance_scores, pair, t) for pair, t in zip(parameters, tensors)]
    masks = [getattr(module, name + "_mask", None) for module, name in targets]
    new_masks = global_masks(method, tensors, scores, masks)
    installed = set()
    with reparam.all_or_nothing([tensor for group in groups for tensor in _tied.tensors(group)]):
        for (root, given), (module, name), group, share in zip(parameters, targets, groups, new_masks):
            if (id(module), name) in installed:
                # Listed twice: like torch, keep the zeros of both shares; the sites' hooks changed since.
                share = getattr(module, name + "_mask") * share
                group = _tied.sites(root, given)
            installed.add((id(module), name))
            custom = CustomFromMask(share)
            custom.chosen_by = pruning_method
            _tied.share(group, install_mask(module, name, custom, share, list(group[0].hooks)))


def global_masks(
    method: BasePruningMethod,
    tensors: Sequence[torch.Tensor],
    scores: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor | None],
) -> list[torch.Tensor]:
    """Each tensor's final mask when ``method`` prunes ``tensors`` together, as one vector.

    ``scores`` rank the entries (the tensors themselves, or importance scores of
    their shapes); ``masks`` are the tensors' earlier masks (``None``: nothing
    pruned yet). Each mask returned has its tensor's shape, dtype and device
    (bool under :func:`prunereg.compact_masks`). This is the tensor-level core
    of :func:`global_unstructured`, also used to prune a checkpoint's tensors
    without building a model.
    """
    entries = [Entry(t, s, m) for t, s, m in zip(tensors, scores, masks)]
    if is_dtensor(entries[0].tensor):
        # As in one process, the method sees what earlier pruning left in all tensors as one
        # vector, here spread over the ranks, each holding the part from its own shards.
        view = global_shares.local_view(entries)
        shares = global_shares.wrap_shares(_concatenated(method, view.entries, view.spread), view)
    else:
        shares = _shares(method, entries)
    for entry, share in zip(entries, shares):
        if entry.old_mask is not None:
            _times_old_mask(share, entry.old_mask)
    return shares


class _Block(NamedTuple):
    """Part of one entry in the stream: flat ``[start, stop)``, its remaining entries and their keys."""

    entry: int
    start: int
    stop: int
    remaining: torch.Tensor | None  # bool over the block; None: all remain
    keys: torch.Tensor


def _shares(method: BasePruningMethod, entries: list[Entry]) -> list[torch.Tensor]:
    """Each entry's share of the global mask (torch's ``final_mask`` slices), in its tensor's dtype and device."""
    meta = {e.tensor.is_meta for e in entries}
    if len(meta) > 1 or (meta == {False} and any(e.scores.is_meta for e in entries)):
        raise TypeError("global_unstructured(): cannot prune meta tensors together with tensors that hold data")
    if meta == {True}:  # shapes only: scores and masks of any device go to meta too
        return _concatenated(method, entries, meta=True)
    kind = _ranking(method)
    if kind is None:
        return _concatenated(method, entries)
    remaining = sum(_remaining_count(e) for e in entries)
    dtype = radix.promoted_dtype([e.scores for e in entries])
    if select.uses_topk(remaining, entries[0].scores.device, dtype):
        return _concatenated(method, entries)
    with bounded_threads(select.BLOCK, entries[0].scores.device):  # as select_k's radix path
        return _streamed(kind, method, entries, remaining)


_RANKINGS = ("magnitude", "random")


def _ranking(method: BasePruningMethod) -> str | None:
    """How ``method`` declares it ranks entries (``RANKED_BY``), checked; None: it does not say."""
    kind = method.RANKED_BY
    if kind is None:
        return None
    if kind not in _RANKINGS:
        raise ValueError(f"{type(method).__name__}.RANKED_BY must be one of {_RANKINGS} or None, not {kind!r}")
    if not hasattr(method, "amount"):
        raise TypeError(f"{type(method).__name__} sets RANKED_BY, so it needs an `amount` attribute")
    return kind


def _streamed(kind: str, method: BasePruningMethod, entries: list[Entry], remaining: int) -> list[torch.Tensor]:
    amount = method.amount  # type: ignore[attr-defined]  # checked by _ranking
    k = nparams_to_prune(amount, remaining)
    validate_amount(k, remaining)
    dtype = radix.promoted_dtype([e.scores for e in entries])
    shares = [_fresh_mask(e, filled=k == 0) for e in entries]
    if k == 0:
        return shares
    device = entries[0].scores.device
    workspace = radix.Workspace()
    draws = _Draws(dtype, device, remaining, workspace) if kind == "random" else None

    clean: dict[tuple[int, int], bool] = {}  # blocks an earlier pass found free of NaN (and negatives)

    def blocks() -> Iterator[_Block]:
        if draws is not None:
            draws.restart()
        for index, entry in enumerate(entries):
            scores = entry.scores.reshape(-1)
            old = entry.old_mask.reshape(-1) if entry.old_mask is not None else None
            for start in range(0, scores.numel(), select.BLOCK):
                stop = min(start + select.BLOCK, scores.numel())
                keep = (old[start:stop] == 1).to(scores.device) if old is not None else None
                if draws is not None:
                    values = draws.next(stop - start if keep is None else int(torch.count_nonzero(keep)))
                else:
                    values = workspace.converted(scores[start:stop], dtype)
                    values = values if keep is None else values[keep]
                keys, clean[index, start] = radix.flat_order_keys(
                    values.reshape(-1), draws is None, workspace, clean=clean.get((index, start), False)
                )
                yield _Block(index, start, stop, keep, keys)

    threshold = radix.find_threshold(
        lambda: (block.keys for block in blocks()),
        k,
        width=radix.key_width(dtype),
        largest=draws is not None,
        two_pass=True,
        device=device,
        workspace=workspace,
    )
    mark = radix.Marker(threshold, workspace)
    places = []
    for block in blocks():
        selected = mark(block.keys, out=workspace.like("selected", block.keys, torch.bool))
        share = shares[block.entry].view(-1)[block.start : block.stop]
        if block.remaining is None:
            share.copy_(selected.logical_not_())  # the share was all ones: keep what is not selected
        else:
            _clear_remaining(share, block.remaining, selected)
        places.append((block.entry, block.start, block.stop))
    for number, positions in mark.finish():
        entry, start, stop = places[number]
        old_mask = entries[entry].old_mask
        if old_mask is not None:  # positions count the remaining entries of the block only
            kept = old_mask.reshape(-1)[start:stop] == 1
            positions = kept.nonzero().squeeze(1)[positions.to(kept.device)]
        share = shares[entry].view(-1)[start:stop]
        share.index_fill_(0, positions.to(share.device), 0)
    return shares


def _clear_remaining(share: torch.Tensor, remaining: torch.Tensor, selected: torch.Tensor) -> None:
    """Zero ``share`` where ``selected`` says so, ``selected`` being over its ``remaining`` entries only."""
    remaining = remaining.to(share.device)
    where = torch.zeros_like(remaining)
    where[remaining] = selected.to(where.device)
    share.masked_fill_(where, 0)


class _Draws:
    """torch's uniform draws for the remaining entries, handed out in order, as often as needed."""

    def __init__(self, dtype: torch.dtype, device: torch.device, total: int, workspace: radix.Workspace) -> None:
        self.dtype = dtype
        self.device = device
        self.workspace = workspace
        if device.type == "cpu":
            # CPU draws are sequential: drawing in pieces gives the same stream.
            self.state = torch.get_rng_state()
            self.drawn = None
        else:
            self.drawn = torch.rand(total, dtype=dtype, device=device)
        self.position = 0

    def restart(self) -> None:
        self.position = 0
        if self.drawn is None:
            torch.set_rng_state(self.state)

    def next(self, count: int) -> torch.Tensor:
        start, self.position = self.position, self.position + count
        if self.drawn is not None:
            return self.drawn[start : self.position]
        out = self.workspace.take("draws", count, self.dtype, self.device)
        return torch.rand(count, dtype=self.dtype, device=self.device, out=out)


def _concatenated(
    method: BasePruningMethod,
    entries: list[Entry],
    spread: SpreadVector | None = None,
    *,
    meta: bool = False,
) -> list[torch.Tensor]:
    """torch's way: the remaining scores (all scores on meta) concatenated on the first device.

    With ``spread``, the entries are the local shards of DTensors: the method
    sees one vector spread over the ranks, each holding the part from its shards.
    """
    device = torch.device("meta") if meta else entries[0].scores.device
    dtype = radix.promoted_dtype([e.scores for e in entries])
    keeps = [None if meta or e.old_mask is None else (e.old_mask.reshape(-1) == 1).to(device) for e in entries]
    relevant = torch.cat(
        [
            (s if keep is None else s[keep])
            for s, keep in zip((e.scores.reshape(-1).to(device, dtype) for e in entries), keeps)
        ]
    )
    mask_dtype = radix.promoted_dtype([e.old_mask if e.old_mask is not None else e.tensor for e in entries])
    default = torch.ones_like(relevant, dtype=mask_dtype)
    if spread is None:
        partial = method.compute_mask(relevant, default_mask=default)
    else:
        partial = local_shard(method.compute_mask(spread(relevant, keeps), default_mask=spread(default)))
    shares = []
    pointer = 0
    for entry, keep in zip(entries, keeps):
        share = _fresh_mask(entry, filled=keep is not None)
        flat = share.view(-1)
        count = flat.numel() if keep is None else int(torch.count_nonzero(keep))
        piece = partial[pointer : pointer + count].to(flat.device, flat.dtype)
        if keep is None:
            flat.copy_(piece)
        else:
            flat[keep.to(flat.device)] = piece
        pointer += count
        shares.append(share)
    return shares


def _times_old_mask(share: torch.Tensor, old_mask: torch.Tensor) -> None:
    """``share *= old_mask`` (what ``custom_from_mask`` does on top of earlier pruning), in place."""
    old_mask = old_mask.to(share.device)
    if share.dtype == torch.bool:
        share.logical_and_(old_mask)
    else:
        share.mul_(old_mask.to(share.dtype))


def _fresh_mask(entry: Entry, *, filled: bool) -> torch.Tensor:
    """A contiguous mask for ``entry``: its current mask, or ones (uninitialized unless ``filled``)."""
    tensor = entry.tensor
    dtype = compact.mask_dtype(tensor.dtype, entry.old_mask)
    if entry.old_mask is not None:
        return entry.old_mask.to(device=tensor.device, dtype=dtype, memory_format=torch.contiguous_format, copy=True)
    if filled:
        return torch.ones(tensor.shape, dtype=dtype, device=tensor.device)
    return torch.empty(tensor.shape, dtype=dtype, device=tensor.device)


def _remaining_count(entry: Entry) -> int:
    if entry.old_mask is None:
        return entry.scores.numel()
    return int(torch.count_nonzero(entry.old_mask == 1))


def _scores_for(
    importance_scores: dict[Parameter, torch.Tensor], pair: Parameter, tensor: torch.Tensor
) -> torch.Tensor:
    """The scores of one parameter, in its shape.

    torch flattens every score tensor, so any shape with the parameter's number
    of entries is accepted; a different count is an IndexError, as it is in
    torch when the counts do not add up.
    """
    scores = importance_scores.get(pair)
    if scores is None:
        return tensor
    if scores.numel() != tensor.numel():
        raise IndexError(
            f"importance_scores for parameter {pair[1]} of {pair[0]} should have "
            f"{tensor.numel()} entries like the parameter, got shape {tuple(scores.shape)}"
        )
    return scores.reshape(tensor.shape)
