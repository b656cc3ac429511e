"""Commands that work on model files: ``prune`` and ``report``.

Exit codes: 0 success, 1 an error in what was asked (a bad file, method or
argument), said in one line on stderr, 2 a usage error (click's). ``--debug``
lets the error through with its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from prunereg._cli.app import main
from prunereg._cli.interrupt import cleanup_on_signals
from prunereg._cli.output import AtomicOutputs

if TYPE_CHECKING:
    import torch

EXIT_CODES = "Exit codes: 0 success, 1 error (bad file, method or argument), 2 usage error."
DEBUG_HELP = "Show the traceback of an error instead of a one-line message."


def parse_value(text: str) -> int | float | str:
    """A command-line value as the number it spells (``3``, ``0.5``, ``inf``, ``-inf``), else as text."""
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


def _parse_arguments(ctx: click.Context, param: click.Parameter, items: tuple[str, ...]) -> dict[str, Any]:
    arguments: dict[str, Any] = {}
    for item in items:
        key, equals, text = item.partition("=")
        if not equals or not key.isidentifier():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", ctx, param)
        if key in arguments:
            raise click.BadParameter(f"{key!r} is given twice", ctx, param)
        arguments[key] = parse_value(text)
    return arguments


@contextlib.contextmanager
def _errors_in_one_line(debug: bool) -> Iterator[None]:
    """Turn an error into a one-line message and exit code 1, unless ``debug``.

    Warnings raised meanwhile (torch's, mostly) are held back: shown once the
    block succeeds, dropped when it fails, where they would only come before
    the one line that says what went wrong. prunereg's warnings about plugins
    are shown either way: they may say why a method is missing.
    """
    from prunereg._plugins.registry import PluginWarning, UnknownMethodError

    try:
        with warnings.catch_warnings(record=True) as held:
            yield
    except Exception as error:
        _show(warning for warning in held if debug or issubclass(warning.category, PluginWarning))
        if debug or isinstance(error, click.ClickException):
            raise
        from prunereg._files.checkpoint import CheckpointError
        from prunereg._files.offline import OfflinePruningError
        from prunereg._text import describe

        if isinstance(error, (CheckpointError, OfflinePruningError, UnknownMethodError)):
            message = str(error).strip().splitlines()[0]
        else:
            message = f"{describe(error)} (run with --debug for the traceback)"
        raise click.ClickException(message) from None
    _show(held)


def _show(held: Iterable[warnings.WarningMessage]) -> None:
    for warning in held:
        warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)


@main.command("prune", epilog=EXIT_CODES)
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.argument("output_path", metavar="OUTPUT", type=click.Path(path_type=Path))
@click.option("--method", "method_name", required=True, metavar="NAME", help="A registered method (prunereg list).")
@click.option("--amount", metavar="X", help="Fraction (0.3) or count (100) of entries or channels to prune.")
@click.option(
    "--arg",
    "arguments",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_parse_arguments,
    help="Another method argument (n=2, dim=0); numbers are parsed, inf included. Repeatable.",
)
@click.option(
    "--include",
    multiple=True,
    metavar="GLOB",
    help="Prune the floating-point tensors whose name matches, instead of the defaults. Repeatable.",
)
@click.option("--exclude", multiple=True, metavar="GLOB", help="Leave tensors whose name matches. Repeatable.")
@click.option("--global", "together", is_flag=True, help="Prune the selected tensors together (unstructured methods).")
@click.option(
    "--device", default="cpu", show_default=True, metavar="DEVICE", help="Where masks are computed (cuda, cuda:1, ...)."
)
@click.option("--seed", type=int, metavar="N", help="Seed torch's generators first, for reproducible random methods.")
@click.option(
    "--masks",
    "masks_path",
    metavar="MASKS_FILE",
    type=click.Path(path_type=Path),
    help="Also write the masks (bool) to this .safetensors file; see prunereg.apply_masks.",
)
@click.option("--force", is_flag=True, help="Replace OUTPUT (and MASKS_FILE) if it exists.")
@click.option("--dry-run", is_flag=True, help="Print which tensors would be pruned and which kept; write nothing.")
@click.option("--debug", is_flag=True, help=DEBUG_HELP)
def prune_command(
    input_path: Path,
    output_path: Path,
    method_name: str,
    amount: str | None,
    arguments: dict[str, Any],
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    together: bool,
    device: str,
    seed: int | None,
    masks_path: Path | None,
    force: bool,
    dry_run: bool,
    debug: bool,
) -> None:
    """Prune the weights in model file INPUT, writing OUTPUT.

    By default every floating-point tensor of 2 or more dimensions is pruned,
    except embeddings, norms and output heads (lm_head, head, pooler,
    classifier, cls, score, qa_outputs), found by name. --include globs replace
    the defaults (the floating-point tensors matching one are pruned), --exclude
    globs leave tensors out; --dry-run shows the choice. Each tensor is pruned
    as torch.nn.utils.prune would prune the parameter holding it. A pruned
    state dict's <name>_orig and <name>_mask are one tensor, <name>: pruned
    again as torch re-prunes it, and written back as a pair with the new mask.
    Everything else in the file is kept. INPUT is never modified; OUTPUT is
    written to a temporary file and put in place at the end, never over a
    file that appeared meanwhile unless --force. Names that a torch file stores
    as one tensor (tied weights) are pruned once and stay one tensor; tensors
    that merely overlap come out as separate tensors. Formats: .safetensors,
    and torch state dicts or checkpoint dicts (.pt, .pth, .bin), read with
    torch.load(weights_only=True).
    """
    if amount is not None:
        if "amount" in arguments:
            raise click.UsageError("give the amount once: --amount or --arg amount=..., not both")
        arguments = {"amount": parse_value(amount), **arguments}
    with _errors_in_one_line(debug):
        from prunereg._files import checkpoint as _checkpoint
        from prunereg._files import offline, shared_storage
        from prunereg._files.pruned_state import PrunedState
        from prunereg._files.selection import select
        from prunereg._progress import progress

        if not dry_run:
            _check_paths(input_path, output_path, masks_path, force)
        make_method = offline.method_factory(method_name, arguments, together=together)
        compute_device = offline.compute_device(device)
        checkpoint = _checkpoint.read(input_path)
        state = PrunedState.of(checkpoint.tensors)
        selection = select(state.tensors, include, exclude)
        if not selection.selected:
            unprunable = _unprunable(checkpoint.tensors)
            raise click.ClickException(selection.why_nothing() + (f" (left alone: {unprunable})" if unprunable else ""))
        if dry_run:
            click.echo(
                f"would prune {len(selection.selected)} of {selection.total} tensors with {method_name} "
                "(dry run: nothing written)"
            )
            click.echo("\n".join(selection.describe()))
            return
        tied = shared_storage.tied_names(state.tensors)
        selected = {name: state.tensors[name] for name in shared_storage.first_names(selection.selected, tied)}
        results = offline.prune(
            selected, make_method, together=together, device=compute_device, seed=seed, prior_masks=state.masks
        )
        pruned, masks = {}, {}
        for name, tensor, mask in progress(results, label=f"pruning with {method_name}", total=len(selected)):
            pruned[name] = tensor
            if masks_path is not None or name in state.pairs:
                masks[name] = mask
        shared_storage.tie(pruned, tied)
        shared_storage.tie(masks, tied, copies=True)  # safetensors refuses shared tensors
        replaced = {}
        for name, tensor in pruned.items():
            replaced.update(state.stored_form(name, tensor, masks.get(name)))
        with cleanup_on_signals(), AtomicOutputs(replace=force) as outputs:
            outputs.stage("OUTPUT", output_path, lambda path: _checkpoint.save(checkpoint, replaced, path))
            if masks_path is not None:
                provenance = {
                    "format": "pt",
                    "prunereg.method": method_name,
                    "prunereg.arguments": json.dumps(arguments),
                    "prunereg.global": str(together).lower(),
                }
                save_masks = functools.partial(_checkpoint.save_safetensors, masks, metadata=provenance)
                outputs.stage("MASKS_FILE", masks_path, save_masks)
    zeros = sum(_count_zeros(tensor) for tensor in pruned.values())
    numel = sum(tensor.numel() for tensor in pruned.values())
    click.echo(
        f"pruned {len(pruned)} of {selection.total} tensors with {method_name}: "
        f"{zeros:,} of {numel:,} entries are zero ({_percent(zeros, numel)}); wrote {output_path}"
        + (f" and {masks_path}" if masks_path is not None else "")
    )
    click.echo("\n".join(selection.describe()))
    _note_unprunable(checkpoint.tensors)


def _check_paths(input_path: Path, output_path: Path, masks_path: Path | None, force: bool) -> None:
    """Refuse, before any work, to write over INPUT, over an existing file without --force, or the wrong format."""
    from prunereg._files.checkpoint import SAFETENSORS, file_format, quoted

    input_format = file_format(input_path)
    targets = [("OUTPUT", output_path, input_format)]
    if masks_path is not None:
        targets.append(("MASKS_FILE", masks_path, SAFETENSORS))
    for label, path, wanted in targets:
        if _same_file(path, input_path):
            raise click.ClickException(
                f"{label} {quoted(path)} is INPUT {quoted(input_path)}; write the result to another file"
            )
        if file_format(path) != wanted:
            raise click.ClickException(
                f"{label} {quoted(path)} must be a {wanted} file" + (" like INPUT" if label == "OUTPUT" else "")
            )
        if path.is_dir():
            raise click.ClickException(f"{label} {quoted(path)} is a directory")
        if (path.exists() or path.is_symlink()) and not force:
            raise click.ClickException(f"{label} {quoted(path)} exists; pass --force to replace it")
        if not path.parent.is_dir():
            raise click.ClickException(f"the directory of {label} {quoted(path)} {_why_not_a_directory(path.parent)}")
    if masks_path is not None and _same_file(masks_path, output_path):
        raise click.ClickException(f"MASKS_FILE {quoted(masks_path)} is OUTPUT; give them different names")


def _why_not_a_directory(path: Path) -> str:
    """What is wrong with OUTPUT's directory ``path``, as the end of a sentence."""
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


def _note_unprunable(tensors: dict[str, torch.Tensor]) -> None:
    """Say on stderr which floating-point tensors were left as they were because pruning cannot compute with them."""
    if unprunable := _unprunable(tensors):
        click.echo(f"note: left as they were: {unprunable}", err=True)


def _unprunable(tensors: dict[str, torch.Tensor]) -> str | None:
    """The float8-like tensors, which pruning cannot compute with, described in a few words; None if there are none."""
    from prunereg._files.dtypes import describe_unprunable, unprunable_floats

    found = unprunable_floats(tensors)
    return describe_unprunable(found) if found else None


@main.command("report", epilog=EXIT_CODES)
@click.argument("file", metavar="FILE", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--debug", is_flag=True, help=DEBUG_HELP)
def report_command(file: Path, as_json: bool, debug: bool) -> None:
    """Show the sparsity of every tensor in model FILE, then the totals.

    A pruned state dict's <name>_orig and <name>_mask are shown as the tensor
    the model uses, <name> (their product), marked as pruned by its mask.
    """
    with _errors_in_one_line(debug):
        from prunereg._files import checkpoint as _checkpoint
        from prunereg._files.pruned_state import PrunedState
        from prunereg._models.summary import Summary, tensor_summary
        from prunereg._progress import progress

        state = PrunedState.of(_checkpoint.read(file).tensors)
        items = progress(
            state.tensors.items(),
            label=f"counting zeros in {file.name}",
            total=len(state.tensors),
            enabled=False if as_json else None,
        )
        report = Summary(
            tuple(tensor_summary(name, tensor, ["mask"] if name in state.pairs else []) for name, tensor in items)
        )
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else str(report))


def _count_zeros(tensor: torch.Tensor) -> int:
    return int((tensor == 0).sum())


def _percent(zeros: int, numel: int) -> str:
    return f"{100 * zeros / numel if numel else 0.0:.1f}%"
