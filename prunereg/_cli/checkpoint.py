"""Commands that work on model files: ``prune`` and ``report``.

Exit codes: 0 success, 1 an error in what was asked (a bad file, method or
argument), said in one line on stderr, 2 a usage error (click's). ``--debug``
lets the error through with its traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from prunereg._cli.app import main

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

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
    """Turn an error into a one-line message and exit code 1, unless ``debug``."""
    from prunereg._registry import UnknownMethodError

    try:
        yield
    except click.ClickException:
        raise
    except Exception as error:
        if debug:
            raise
        from prunereg._checkpoint import CheckpointError, describe
        from prunereg._offline import OfflinePruningError

        if isinstance(error, (CheckpointError, OfflinePruningError, UnknownMethodError)):
            message = str(error).strip().splitlines()[0]
        else:
            message = f"{describe(error)} (run with --debug for the traceback)"
        raise click.ClickException(message) from None


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
@click.option("--include", multiple=True, metavar="GLOB", help="Prune only tensors whose name matches. Repeatable.")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Leave tensors whose name matches. Repeatable.")
@click.option("--global", "together", is_flag=True, help="Prune the selected tensors together (unstructured methods).")
@click.option("--device", default="cpu", show_default=True, metavar="DEVICE", help="Where masks are computed (cuda, cuda:1, ...).")
@click.option("--seed", type=int, metavar="N", help="Seed torch's generators first, for reproducible random methods.")
@click.option(
    "--masks",
    "masks_path",
    metavar="MASKS_FILE",
    type=click.Path(path_type=Path),
    help="Also write the masks (bool) to this .safetensors file; see prunereg.apply_masks.",
)
@click.option("--force", is_flag=True, help="Replace OUTPUT (and MASKS_FILE) if it exists.")
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
    debug: bool,
) -> None:
    """Prune the weights in model file INPUT, writing OUTPUT.

    Every floating-point tensor of at least two dimensions is pruned, narrowed
    by --include and --exclude globs on tensor names; each is pruned as
    torch.nn.utils.prune would prune the parameter holding it. Everything else
    in the file is kept. INPUT is never modified; OUTPUT is written to a
    temporary file and renamed into place. Formats: .safetensors, and torch
    state dicts or checkpoint dicts (.pt, .pth, .bin), read with
    torch.load(weights_only=True).
    """
    if amount is not None:
        if "amount" in arguments:
            raise click.UsageError("give the amount once: --amount or --arg amount=..., not both")
        arguments = {"amount": parse_value(amount), **arguments}
    with _errors_in_one_line(debug):
        from prunereg import _checkpoint, _offline

        _check_paths(input_path, output_path, masks_path, force)
        make_method = _offline.method_factory(method_name, arguments, together=together)
        compute_device = _offline.compute_device(device)
        checkpoint = _checkpoint.read(input_path)
        names = _offline.select(checkpoint.tensors, include, exclude)
        if not names:
            raise click.ClickException(_nothing_selected(checkpoint.tensors, include, exclude))
        selected = {name: checkpoint.tensors[name] for name in names}
        results = _offline.prune(selected, make_method, together=together, device=compute_device, seed=seed)
        pruned, masks = {}, {}
        with _progress(results, len(names), f"pruning with {method_name}") as bar:
            for name, tensor, mask in bar:
                pruned[name] = tensor
                if masks_path is not None:
                    masks[name] = mask
        with _checkpoint.AtomicWrites() as writes:
            writes.stage(output_path, lambda path: _checkpoint.save(checkpoint, pruned, path))
            if masks_path is not None:
                provenance = {"format": "pt", "prunereg.method": method_name,
                              "prunereg.arguments": json.dumps(arguments), "prunereg.global": str(together).lower()}
                writes.stage(masks_path, lambda path: _checkpoint.save_safetensors(masks, path, provenance))
    zeros = sum(_count_zeros(tensor) for tensor in pruned.values())
    numel = sum(tensor.numel() for tensor in pruned.values())
    click.echo(
        f"pruned {len(pruned)} of {len(checkpoint.tensors)} tensors with {method_name}: "
        f"{zeros:,} of {numel:,} entries are zero ({_percent(zeros, numel)}); wrote {output_path}"
        + (f" and {masks_path}" if masks_path is not None else "")
    )


def _check_paths(input_path: Path, output_path: Path, masks_path: Path | None, force: bool) -> None:
    """Refuse, before any work, to write over INPUT, over an existing file without --force, or the wrong format."""
    from prunereg._checkpoint import SAFETENSORS, file_format

    input_format = file_format(input_path)
    targets = [("OUTPUT", output_path, input_format)]
    if masks_path is not None:
        targets.append(("MASKS_FILE", masks_path, SAFETENSORS))
    for label, path, wanted in targets:
        if _same_file(path, input_path):
            raise click.ClickException(f"{label} '{path}' is INPUT '{input_path}'; write the result to another file")
        if file_format(path) != wanted:
            raise click.ClickException(
                f"{label} '{path}' must be a {wanted} file" + (" like INPUT" if label == "OUTPUT" else "")
            )
        if path.is_dir():
            raise click.ClickException(f"{label} '{path}' is a directory")
        if (path.exists() or path.is_symlink()) and not force:
            raise click.ClickException(f"{label} '{path}' exists; pass --force to replace it")
        if not path.parent.is_dir():
            raise click.ClickException(f"the directory of {label} '{path}' does not exist")
    if masks_path is not None and _same_file(masks_path, output_path):
        raise click.ClickException(f"MASKS_FILE '{masks_path}' is OUTPUT; give them different names")


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # hard links
    except OSError:
        return False


def _nothing_selected(tensors: dict[str, torch.Tensor], include: tuple[str, ...], exclude: tuple[str, ...]) -> str:
    refinements = [f"--include {glob}" for glob in include] + [f"--exclude {glob}" for glob in exclude]
    return (
        f"no tensor selected: none of the {len(tensors)} tensors is floating point with 2 or more dimensions"
        + (f" and matches {' '.join(refinements)}" if refinements else "")
    )


@contextlib.contextmanager
def _progress(items: Iterable[T], length: int, label: str) -> Iterator[Iterable[T]]:
    """A progress bar on stderr, shown only when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield items
        return
    with click.progressbar(items, length=length, label=label, file=sys.stderr) as bar:
        yield bar


@main.command("report", epilog=EXIT_CODES)
@click.argument("file", metavar="FILE", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--debug", is_flag=True, help=DEBUG_HELP)
def report_command(file: Path, as_json: bool, debug: bool) -> None:
    """Show the sparsity of every tensor in model FILE, then the totals."""
    with _errors_in_one_line(debug):
        from prunereg import _checkpoint

        tensors = _checkpoint.read(file).tensors
        rows = [
            {
                "name": name,
                "shape": list(tensor.shape),
                "dtype": str(tensor.dtype).removeprefix("torch."),
                "numel": tensor.numel(),
                "zeros": _count_zeros(tensor),
            }
            for name, tensor in tensors.items()
        ]
    for row in rows:
        row["sparsity"] = _sparsity(row["zeros"], row["numel"])
    numel = sum(row["numel"] for row in rows)
    zeros = sum(row["zeros"] for row in rows)
    if as_json:
        total = {"numel": numel, "zeros": zeros, "sparsity": _sparsity(zeros, numel)}
        click.echo(json.dumps({"tensors": rows, "total": total}, indent=2))
        return
    header = ["NAME", "SHAPE", "DTYPE", "NUMEL", "ZEROS", "SPARSITY"]
    table = [header] + [
        [row["name"], "x".join(map(str, row["shape"])) or "scalar", row["dtype"],
         f"{row['numel']:,}", f"{row['zeros']:,}", _percent(row["zeros"], row["numel"])]
        for row in rows
    ]
    table.append(["total", "", "", f"{numel:,}", f"{zeros:,}", _percent(zeros, numel)])
    bars = [""] + [_bar(row["sparsity"]) for row in rows] + [_bar(_sparsity(zeros, numel))]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line, bar in zip(table, bars):
        cells = [cell.ljust(width) if i < 3 else cell.rjust(width) for i, (cell, width) in enumerate(zip(line, widths))]
        click.echo(("  ".join(cells) + "  " + bar).rstrip())


def _count_zeros(tensor: torch.Tensor) -> int:
    return int((tensor == 0).sum())


def _sparsity(zeros: int, numel: int) -> float:
    return zeros / numel if numel else 0.0


def _percent(zeros: int, numel: int) -> str:
    return f"{100 * _sparsity(zeros, numel):.1f}%"


def _bar(sparsity: float, width: int = 10) -> str:
    filled = round(sparsity * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"
