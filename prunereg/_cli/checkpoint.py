"""Commands that work on model files: ``prune`` and ``report``.

Exit codes: 0 success, 1 an error in what was asked (a bad file, method or
argument), said in one line on stderr, 2 a usage error (click's). ``--debug``
(every command's, :mod:`prunereg._cli.errors`) lets the error through with its traceback.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click

from prunereg._cli.app import main
from prunereg._cli.errors import EXIT_CODES
from prunereg._cli.values import Number, key_values, parse_option_value
from prunereg._cli.values import parse_value as parse_value  # the one parser, under its old name here
from prunereg._models.grouping import BY


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
    callback=key_values,
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
@click.option(
    "--seed", type=Number(int), metavar="N", help="Seed torch's generators first, for reproducible random methods."
)
@click.option(
    "--masks",
    "masks_path",
    metavar="MASKS_FILE",
    type=click.Path(path_type=Path),
    help="Also write the masks (bool) to this .safetensors file; see prunereg.apply_masks.",
)
@click.option("--force", is_flag=True, help="Replace OUTPUT (and MASKS_FILE) if it exists.")
@click.option("--dry-run", is_flag=True, help="Print which tensors would be pruned and which kept; write nothing.")
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
    and torch state dicts or checkpoint dicts (.pt, .pth, .bin, Lightning's
    .ckpt), read with torch.load(weights_only=True); or a Hugging Face model
    folder (one weight file or an index and its shards), written as a folder
    with the same files and a copy of the others (config, tokenizer).
    """
    if amount is not None:
        if "amount" in arguments:
            raise click.UsageError("give the amount once: --amount or --arg amount=..., not both")
        arguments = {"amount": parse_option_value(amount, "--amount"), **arguments}
    from prunereg._files import file_pruning

    report = file_pruning.run(
        input_path,
        output_path,
        method_name,
        arguments,
        include=include,
        exclude=exclude,
        together=together,
        device=device,
        seed=seed,
        masks_path=masks_path,
        force=force,
        dry_run=dry_run,
        progress=None,
        labels=file_pruning.CLI_LABELS,
    )
    click.echo(str(report))
    if report.unprunable and not dry_run:
        click.echo(f"note: left as they were: {report.unprunable}", err=True)
    if report.left_out:
        click.echo(f"note: not copied to OUTPUT: {', '.join(map(repr, report.left_out))}", err=True)


@main.command("report", epilog=EXIT_CODES)
@click.argument("file", metavar="FILE", type=click.Path(path_type=Path))
@click.option(
    "--by",
    type=click.Choice(BY),
    help="One row per block (model.layers.3) or per type (model.layers.*.mlp.up_proj.weight) instead of per tensor.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def report_command(file: Path, by: str | None, as_json: bool) -> None:
    """Show the sparsity of every tensor in model FILE, then the totals.

    FILE is a model file or a Hugging Face model folder (what save_pretrained
    and prunereg oneshot write). A pruned state dict's <name>_orig and
    <name>_mask are shown as the tensor the model uses, <name> (their
    product), marked as pruned by its mask.
    """
    from prunereg._files.model_folder import read_model
    from prunereg._files.pruned_state import PrunedState
    from prunereg._files.shared_storage import tied_names
    from prunereg._models import summary as _summary
    from prunereg._progress import progress

    state = PrunedState.of(read_model(file, "FILE").tensors)
    tied = tied_names(state.tensors)  # one tensor under many names is counted once
    items = progress(
        state.tensors.items(),
        label=f"counting zeros in {file.name}",
        total=len(state.tensors),
        enabled=False if as_json else None,
    )
    rows: dict[str, _summary.TensorSummary] = {}
    for name, tensor in items:
        pruned_by = ["mask"] if name in state.pairs else []
        first = rows.get(tied.get(name, ""))
        rows[name] = (
            dataclasses.replace(first, name=name)
            if first is not None
            else _summary.tensor_summary(name, tensor, pruned_by)
        )
    report = _summary.Summary(tuple(rows.values()))
    shown = report if by is None else report.grouped(by)
    click.echo(json.dumps(shown.as_dict(), indent=2) if as_json else str(shown))
