"""Pruning a model file from end to end: :func:`prunereg.prune_file`, which ``prunereg prune`` runs.

The workflow: check the paths, read the file, see a pruned state dict's
``<name>_orig``/``<name>_mask`` pairs as one tensor, select the tensors, prune
each tensor shared by several names once, give every tied name the result,
write pairs back as pairs, and put the output (and the masks) in place
atomically. Every promise of ``docs/reliability.md`` about ``prunereg prune``
is kept here, so the library keeps them too: the source is only read, the
target appears whole or not at all, never over a file without ``force`` (not
even one that appears meanwhile), SIGTERM and SIGHUP during the write leave no
temporary file.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from prunereg._disk.errors import CheckpointError, quoted
from prunereg._disk.files import AtomicOutputs
from prunereg._disk.folder import AtomicFolder
from prunereg._disk.paths import identity, within
from prunereg._disk.signals import cleanup_on_signals
from prunereg._files import checkpoint as _checkpoint
from prunereg._files import offline, shared_storage
from prunereg._files.dtypes import describe_unprunable, unprunable_floats
from prunereg._files.model_folder import FolderCheckpoint, read_model
from prunereg._files.offline import OfflinePruningError
from prunereg._files.pruned_state import PrunedState
from prunereg._files.selection import Selection, select
from prunereg._progress import progress as progress_bar
from prunereg._text import printable


@dataclass(frozen=True)
class Labels:
    """How messages name the three paths and the way to replace a file: the CLI's words or Python's."""

    source: str = "source"
    target: str = "target"
    masks: str = "masks"
    force_hint: str = "pass force=True to replace it"


PYTHON_LABELS = Labels()
CLI_LABELS = Labels("INPUT", "OUTPUT", "MASKS_FILE", "pass --force to replace it")


@dataclass(frozen=True)
class PruneFileReport:
    """What :func:`prunereg.prune_file` did; ``str()`` is what ``prunereg prune`` prints."""

    source: Path
    target: Path | None
    """None for a dry run."""
    masks: Path | None
    method: str
    arguments: dict[str, Any]
    selection: Selection
    """Which tensors were selected, and why each other one was left alone."""
    pruned: tuple[str, ...] = ()
    """The names written pruned, tied names included, in file order; empty for a dry run."""
    numel: int = 0
    """Entries of the pruned tensors."""
    zeros: int = 0
    """Zero entries of the pruned tensors, after pruning."""
    unprunable: str | None = None
    """The floating-point tensors left as they were because pruning cannot compute with them, in a few words."""
    left_out: tuple[str, ...] = ()
    """A model folder's entries that were not copied to the output folder (subfolders, non-regular files)."""
    dry_run: bool = False
    labels: Labels = field(default=PYTHON_LABELS, repr=False, compare=False)

    @property
    def sparsity(self) -> float:
        """Zeros over entries of the pruned tensors (0.0 when none)."""
        return self.zeros / self.numel if self.numel else 0.0

    def lines(self) -> list[str]:
        """The summary line, then the selection: selected tensors and skipped ones grouped by reason."""
        selected, total = len(self.selection.selected), self.selection.total
        method = printable(self.method)
        if self.dry_run:
            first = f"would prune {selected} of {total} tensors with {method} (dry run: nothing written)"
        else:
            wrote = printable(str(self.target)) + (f" and {printable(str(self.masks))}" if self.masks else "")
            first = (
                f"pruned {len(self.pruned)} of {total} tensors with {method}: "
                f"{self.zeros:,} of {self.numel:,} entries are zero ({100 * self.sparsity:.1f}%); wrote {wrote}"
            )
        return [first, *self.selection.describe()]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def as_dict(self) -> dict[str, Any]:
        """JSON-able data: paths as text, the selection as names and reasons."""
        return {
            "source": str(self.source),
            "target": None if self.target is None else str(self.target),
            "masks": None if self.masks is None else str(self.masks),
            "method": self.method,
            "arguments": self.arguments,
            "dry_run": self.dry_run,
            "selected": list(self.selection.selected),
            "skipped": dict(self.selection.skipped),
            "pruned": list(self.pruned),
            "numel": self.numel,
            "zeros": self.zeros,
            "sparsity": self.sparsity,
            "unprunable": self.unprunable,
            "left_out": list(self.left_out),
        }


def prune_file(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str] | None,
    method: str,
    *,
    amount: float | None = None,
    arguments: Mapping[str, Any] | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    global_pruning: bool = False,
    device: str | torch.device = "cpu",
    seed: int | None = None,
    masks: str | os.PathLike[str] | None = None,
    force: bool = False,
    dry_run: bool = False,
    progress: bool | None = False,
) -> PruneFileReport:
    """Prune the weights in model file ``source`` with registered ``method``, writing ``target``.

    What ``prunereg prune`` does, option for option (see ``docs/cli.md``)::

        report = prunereg.prune_file("model.safetensors", "pruned.safetensors", "l1_unstructured", amount=0.5)
        print(report)           # what the command prints
        report.sparsity         # zeros over entries of the pruned tensors

    ``amount`` and the other ``arguments`` of the method (``{"n": 2, "dim": 0}``)
    build one method per tensor. By default every floating-point tensor of two
    or more dimensions is pruned except embeddings, norms and output heads;
    ``include`` globs replace the defaults, ``exclude`` globs leave tensors out.
    ``global_pruning`` prunes the selected tensors together (unstructured
    methods), ``seed`` seeds torch first, ``device`` is where masks are
    computed, ``masks`` also writes the bool masks to a ``.safetensors`` file,
    ``dry_run`` only selects (``target`` may then be None), ``progress`` draws a
    bar on stderr (None: when it is a terminal).

    ``source`` is only read; ``target`` (and ``masks``) appear whole or not at
    all, never over an existing file unless ``force``, which replaces it
    atomically. Errors: ``CheckpointError`` for a file that cannot be read or
    written (``prunereg._disk.errors``), ``OfflinePruningError`` (a
    ``ValueError``) for a request that cannot be carried out,
    :class:`prunereg.UnknownMethodError` for an unknown method; nothing is
    written then.
    """
    return run(
        Path(source),
        None if target is None else Path(target),
        method,
        method_arguments(amount, arguments or {}),
        include=tuple(include),
        exclude=tuple(exclude),
        together=global_pruning,
        device=device,
        seed=seed,
        masks_path=None if masks is None else Path(masks),
        force=force,
        dry_run=dry_run,
        progress=progress,
    )


def method_arguments(amount: float | None, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` with ``amount`` first; ``ValueError`` when the amount is given both ways."""
    if amount is None:
        return dict(arguments)
    if "amount" in arguments:
        raise OfflinePruningError("give the amount once: as amount or in arguments, not both")
    return {"amount": amount, **arguments}


def run(
    source: Path,
    target: Path | None,
    method: str,
    arguments: dict[str, Any],
    *,
    include: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    together: bool = False,
    device: str | torch.device = "cpu",
    seed: int | None = None,
    masks_path: Path | None = None,
    force: bool = False,
    dry_run: bool = False,
    progress: bool | None = False,
    labels: Labels = PYTHON_LABELS,
) -> PruneFileReport:
    """:func:`prune_file` with the messages' ``labels`` chosen (the CLI's or Python's)."""
    if not dry_run:
        if target is None:
            raise OfflinePruningError(f"no {labels.target} given; name the file to write, or make it a dry run")
        check_paths(source, target, masks_path, force, labels)
    make_method = offline.method_factory(method, arguments, together=together)
    compute_device = offline.compute_device(str(device) if isinstance(device, torch.device) else device)
    checkpoint = read_model(source, labels.source)
    state = PrunedState.of(checkpoint.tensors)
    selection = select(state.tensors, include, exclude)
    unprunable = _unprunable(checkpoint.tensors)
    report = PruneFileReport(
        source, target, masks_path, method, arguments, selection, unprunable=unprunable, dry_run=dry_run, labels=labels
    )
    if not selection.selected:
        raise OfflinePruningError(selection.why_nothing() + (f" (left alone: {unprunable})" if unprunable else ""))
    if dry_run:
        return report
    assert target is not None  # checked above
    tied = shared_storage.tied_names(state.tensors)
    selected = {name: state.tensors[name] for name in shared_storage.first_names(selection.selected, tied)}
    results = offline.prune(
        selected, make_method, together=together, device=compute_device, seed=seed, prior_masks=state.masks
    )
    pruned, masks = {}, {}
    for name, tensor, mask in progress_bar(
        results, label=f"pruning with {printable(method)}", total=len(selected), enabled=progress
    ):
        pruned[name] = tensor
        if masks_path is not None or name in state.pairs:
            masks[name] = mask
    shared_storage.tie(pruned, tied)
    shared_storage.tie(masks, tied, copies=True)  # safetensors refuses shared tensors
    replaced = {}
    for name, tensor in pruned.items():
        replaced.update(state.stored_form(name, tensor, masks.get(name)))
    provenance = {
        "format": "pt",
        "prunereg.method": method,
        "prunereg.arguments": json.dumps(arguments),
        "prunereg.global": str(together).lower(),
    }
    save_masks = functools.partial(_checkpoint.save_safetensors, masks, metadata=provenance)
    left_out: list[str] = []
    if isinstance(checkpoint, FolderCheckpoint):
        left_out = _write_folder(checkpoint, replaced, target, masks_path, save_masks, force, labels)
    else:
        with cleanup_on_signals(), AtomicOutputs(replace=force, force_hint=labels.force_hint) as outputs:
            outputs.stage(labels.target, target, lambda path: _checkpoint.save(checkpoint, replaced, path))
            if masks_path is not None:
                outputs.stage(labels.masks, masks_path, save_masks)
    return PruneFileReport(
        source,
        target,
        masks_path,
        method,
        arguments,
        selection,
        pruned=tuple(pruned),
        numel=sum(tensor.numel() for tensor in pruned.values()),
        zeros=sum(int((tensor == 0).sum()) for tensor in pruned.values()),
        unprunable=unprunable,
        left_out=tuple(left_out),
        labels=labels,
    )


def _write_folder(
    checkpoint: FolderCheckpoint,
    replaced: Mapping[str, torch.Tensor],
    target: Path,
    masks_path: Path | None,
    save_masks: Callable[[str], object],
    force: bool,
    labels: Labels,
) -> list[str]:
    """Write the pruned folder to ``target`` (and the masks file), each whole or not at all; what was left out.

    The masks file is written first and put in place last: if its name is
    taken by then, the folder this run created is taken back.
    """
    created: tuple[int, int] | None = None
    try:
        with cleanup_on_signals(), AtomicOutputs(replace=force, force_hint=labels.force_hint) as outputs:
            if masks_path is not None:
                outputs.stage(labels.masks, masks_path, save_masks)
            try:
                with _output_folder(checkpoint.path, target, force, labels) as staging:
                    left_out = checkpoint.save(replaced, staging)
            except OSError as error:  # AtomicFolder's errors are complete sentences
                raise CheckpointError(str(error)) from error
            if not force:
                created = identity(target)
    except BaseException:
        if created is not None and identity(target) == created:
            shutil.rmtree(target, ignore_errors=True)
        raise
    return left_out


def _output_folder(source: Path, target: Path, force: bool, labels: Labels) -> AtomicFolder:
    return AtomicFolder(
        target, replace=force, label=labels.target, replace_hint=labels.force_hint, keep={labels.source: source}
    )


def check_paths(source: Path, target: Path, masks_path: Path | None, force: bool, labels: Labels) -> None:
    """Refuse, before any work, to write over the source, over an existing file without force, or the wrong format."""
    if source.is_dir():
        _check_folder_paths(source, target, masks_path, force, labels)
        return
    source_format = _checkpoint.file_format(source)
    targets = [(labels.target, target, source_format)]
    if masks_path is not None:
        targets.append((labels.masks, masks_path, _checkpoint.SAFETENSORS))
    for label, path, wanted in targets:
        if _same_file(path, source):
            raise CheckpointError(
                f"{label} {quoted(path)} is {labels.source} {quoted(source)}; write the result to another file"
            )
        if _checkpoint.file_format(path) != wanted:
            raise CheckpointError(
                f"{label} {quoted(path)} must be a {wanted} file"
                + (f" like {labels.source}" if label == labels.target else "")
            )
        if path.is_dir():
            raise CheckpointError(f"{label} {quoted(path)} is a directory")
        if (path.exists() or path.is_symlink()) and not force:
            raise CheckpointError(f"{label} {quoted(path)} exists; {labels.force_hint}")
        if not path.parent.is_dir():
            raise CheckpointError(f"the directory of {label} {quoted(path)} {_why_not_a_directory(path.parent)}")
    if masks_path is not None and _same_file(masks_path, target):
        raise CheckpointError(f"{labels.masks} {quoted(masks_path)} is {labels.target}; give them different names")


def _check_folder_paths(source: Path, target: Path, masks_path: Path | None, force: bool, labels: Labels) -> None:
    """A model folder is written as a folder, never into the source folder, never over one without force."""
    if target.suffix.lower() in _checkpoint.FORMATS:
        raise CheckpointError(f"{labels.target} {quoted(target)} must be a folder like {labels.source}")
    if within(target, source):
        where = "is" if within(source, target) else "is inside"
        raise CheckpointError(
            f"{labels.target} {quoted(target)} {where} {labels.source} {quoted(source)}; write the result elsewhere"
        )
    try:
        _output_folder(source, target, force, labels).check()
    except OSError as error:
        raise CheckpointError(str(error)) from error
    if masks_path is None:
        return
    for label, folder in ((labels.source, source), (labels.target, target)):
        if within(masks_path, folder):
            raise CheckpointError(f"{labels.masks} {quoted(masks_path)} is inside {label}; write it elsewhere")
    if _checkpoint.file_format(masks_path) != _checkpoint.SAFETENSORS:
        raise CheckpointError(f"{labels.masks} {quoted(masks_path)} must be a safetensors file")
    if (masks_path.exists() or masks_path.is_symlink()) and not force:
        raise CheckpointError(f"{labels.masks} {quoted(masks_path)} exists; {labels.force_hint}")


def _why_not_a_directory(path: Path) -> str:
    """What is wrong with the target's directory ``path``, as the end of a sentence."""
    try:
        os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "is a symlink loop"
        return "does not exist"
    return "is not a directory"


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.resolve() == b.resolve():
            return True
        return os.path.samefile(a, b)  # hard links
    except (OSError, RuntimeError):  # missing, or a symlink loop (RuntimeError before Python 3.13)
        return False


def _unprunable(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The float8-like tensors, which pruning cannot compute with, described in a few words; None if there are none."""
    found = unprunable_floats(tensors)
    return describe_unprunable(found) if found else None
