"""``prunereg slim``: make a Hugging Face model folder physically smaller, channels and heads removed.

The model comes from MODEL_DIR, read as untrusted input
(:mod:`prunereg._models.hf_folder`: none of its code runs, nothing outside it
is read, no weight is made up); ``config.json``'s ``architectures`` names the
transformers class. :func:`prunereg.slim` runs on an example input the config
describes (a few token ids, or one image of the config's size). Without
``--ratio`` it removes the channels the folder's masks
(``prunereg_masks.safetensors``, from ``prunereg.save_pretrained`` or
``prunereg oneshot --masks``) pruned whole. The slimmed model is written to
OUTPUT_DIR through :class:`~prunereg._disk.folder.AtomicFolder` (whole or not
at all), with the tokenizer and preprocessor files copied, and loads with
``from_pretrained`` (stock transformers when the config states the new
widths, else ``prunereg.from_pretrained``). Needs the ``hf`` extra.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from prunereg._cli.app import main
from prunereg._cli.errors import EXIT_CODES
from prunereg._cli.shared import force_option, json_option, output_folder
from prunereg._cli.values import Number
from prunereg._disk.input_file import copy_regular
from prunereg._disk.model_dir import replace_hint
from prunereg._disk.signals import cleanup_on_signals
from prunereg._progress import library_bars
from prunereg._text import printable

_BESIDE_THE_WEIGHTS = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "preprocessor_config.json",
)  # fmt: skip
"""Files a model folder holds besides its config and weights, copied as they are."""


@main.command("slim", epilog=EXIT_CODES)
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("output_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--ratio",
    type=Number(float, 0, below=1),
    help="Share of every dependency group's channels (heads, convolution groups) to remove, in [0, 1). Without "
    "it: the channels MODEL_DIR's masks pruned whole.",
)
@click.option(
    "--importance",
    help="How channels are ranked, with --ratio: magnitude, random, taylor, or a registered importance "
    "[default: magnitude].",
)
@click.option("--ignore", multiple=True, metavar="MODULE", help="A module to keep whole (its name). Repeatable.")
@click.option(
    "--round-to", type=Number(int, 1), default=1, show_default=True, help="With --ratio, keep a multiple of N."
)
@click.option(
    "--grouped",
    type=click.Choice(["whole", "inside"]),
    default="whole",
    show_default=True,
    help="How a grouped convolution loses channels: whole groups, or the same channels inside every group.",
)
@force_option
@json_option
def slim_command(
    model_dir: Path,
    output_dir: Path,
    ratio: float | None,
    importance: str | None,
    ignore: tuple[str, ...],
    round_to: int,
    grouped: str,
    force: bool,
    as_json: bool,
) -> None:
    """Remove channels and heads from the model in MODEL_DIR and write the smaller model to OUTPUT_DIR.

    MODEL_DIR is untrusted: none of its code runs, no link out of it is
    followed, and weights it lacks or the model does not know are refused.
    OUTPUT_DIR is built beside its place and appears only when complete; one
    that holds files is replaced only with --force.

    \b
    prunereg slim ./resnet-50 ./resnet-50-slim --ratio 0.5
    prunereg slim ./SmolLM2 ./SmolLM2-slim --ratio 0.3 --ignore lm_head --json
    prunereg slim ./pruned-with-masks ./slim        # the channels its masks pruned
    """
    output = output_folder(output_dir, model_dir, force)
    try:
        import transformers  # noqa: F401
    except ImportError as error:
        raise click.ClickException(
            "prunereg slim needs transformers: pip install -c constraints.txt -e '.[hf]' in prunereg's clone"
        ) from error
    import prunereg
    from prunereg._slim.engine import ArgumentError, check_arguments

    try:  # before the model loads; an unknown importance is an error of status 1, as an unknown method
        check_arguments(ratio, importance, list(ignore), round_to, grouped)
    except ArgumentError as error:
        raise click.UsageError(error.command_line_message) from None
    model = _load(model_dir, masked=ratio is None)
    report = prunereg.slim(
        model,
        _example_inputs(model),
        ratio=ratio,
        importance=importance,
        ignore=list(ignore),
        round_to=round_to,
        grouped=grouped,
    )
    with cleanup_on_signals(), output as staging, library_bars():  # transformers' bar for the weights it writes
        if prunereg.is_pruned(model):
            prunereg.save_pretrained(model, staging)
        else:
            model.save_pretrained(staging)
        for name in _BESIDE_THE_WEIGHTS:
            source = model_dir / name
            if source.is_file() and not source.is_symlink():
                copy_regular(source, Path(staging) / name, "file of a model folder", replace_hint(name))
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else str(report))
    if not as_json:
        click.echo(f"wrote {printable(str(output_dir))}")


def _load(model_dir: Path, *, masked: bool) -> Any:
    """MODEL_DIR's model; with ``masked``, pruned again with the folder's masks (which must exist)."""
    from prunereg._models.hf_folder import checked_model_class, load_model
    from prunereg._models.huggingface import MASKS_FILE, from_pretrained

    if not masked:
        return load_model(model_dir)
    if not (model_dir / MASKS_FILE).is_file():
        raise click.ClickException(
            f"MODEL_DIR has no {MASKS_FILE}, so no channel is pruned yet: give --ratio, or prune it first "
            "(prunereg oneshot --masks, prunereg.save_pretrained of a pruned model)"
        )
    config, cls = checked_model_class(model_dir)
    return from_pretrained(cls, model_dir, config=config).eval()


def _example_inputs(model: Any) -> dict[str, Any]:
    """An input the model's config describes: 16 token ids, or one image of its size."""
    import torch

    config = model.config
    name = getattr(model, "main_input_name", "input_ids")
    generator = torch.Generator().manual_seed(0)
    if name == "pixel_values":
        size = getattr(config, "image_size", 224)
        height, width = (size, size) if isinstance(size, int) else tuple(size)
        dtype = next(model.parameters()).dtype
        pixels = torch.randn(1, getattr(config, "num_channels", 3), height, width, generator=generator)
        return {name: pixels.to(dtype)}
    if name == "input_ids" and isinstance(getattr(config, "vocab_size", None), int):
        length = min(16, getattr(config, "max_position_embeddings", None) or 16)
        return {name: torch.randint(config.vocab_size, (1, length), generator=generator)}
    raise click.ClickException(f"MODEL_DIR's model takes {name!r}, for which prunereg slim cannot make an input")
