"""One-shot pruning of a Hugging Face model folder one decoder block at a time, for models larger than RAM.

The folder is streamed as :mod:`prunereg._runtime.streamed` streams it: each
block is read from the folder's safetensors files, pruned, written to the output
folder as its own shard and emptied again. The output folder holds the other
files of the input folder (config, tokenizer) and an index, so
``from_pretrained`` loads it. It is written through
:class:`~prunereg._disk.folder.AtomicFolder`: whole, or not at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from prunereg._disk.folder import AtomicFolder
from prunereg._oneshot.contract import CalibratedMethod
from prunereg._oneshot.engine import OneShotJob
from prunereg._oneshot.report import OneShotReport
from prunereg._oneshot.settings import OneShotOptions
from prunereg._runtime.calibration import calibration_ids
from prunereg._runtime.options import with_options_signature
from prunereg._runtime.ranks import Ranks, together
from prunereg._runtime.streamed import ReadBlocks, open_folder, output_folder

#: The settings :func:`oneshot_folder` does not take, and why.
FOLDER_REFUSES = {
    "permanent": "oneshot_folder writes plain pruned weights (permanent=True)",
    "restore_on_error": "oneshot_folder writes a new folder, which a failure leaves out; model_dir is never changed",
}


@with_options_signature(OneShotOptions, leave_out=FOLDER_REFUSES)
def oneshot_folder(
    model_dir: str | Path,
    output_dir: str | Path,
    method: str | CalibratedMethod,
    *,
    calibration: Any,
    tokenizer: Any = None,
    num_samples: int | None = None,
    seq_len: int | None = None,
    replace: bool = False,
    device: str | torch.device | None = None,
    **options: Any,
) -> OneShotReport:
    """Prune the Hugging Face causal LM in ``model_dir`` block by block into ``output_dir``, never all in memory.

    Settings and method options as :func:`prunereg.oneshot` (but ``permanent``
    and ``restore_on_error``; a calibration text is tokenised with ``tokenizer``
    or else ``model_dir``'s own); the weights in ``model_dir`` must be
    safetensors files (``model.safetensors`` or a sharded index, chosen as
    transformers chooses). ``output_dir`` gets the pruned weights, one shard
    per block, and the folder's other files, so ``from_pretrained(output_dir)``
    loads the pruned model. The pruning is permanent (plain weights with zeros).
    ``device`` is where the blocks run (``"cuda"``; default: the CPU): each is
    read onto it, pruned there and written from it.

    ``model_dir`` is read as untrusted input: none of its code runs, no link
    out of it is followed, and weights it lacks or the model does not know are
    refused. ``output_dir`` is built beside its place and appears only when
    complete; a folder that is there and not empty is replaced only with
    ``replace=True`` (in one step on Linux), and never when it is or holds
    ``model_dir``.
    """
    settings, method_options = OneShotOptions.split(options, refused=FOLDER_REFUSES)
    ranks = Ranks.current(settings.data_parallel)
    with together(ranks):  # the others wait at its last exchange until rank 0's folder is in place
        folder = output_folder(output_dir, model_dir, replace=replace)
        calibration = calibration_ids(
            calibration, tokenizer=tokenizer, num_samples=num_samples, seq_len=seq_len, folder=Path(model_dir),
            label="model_dir",
        )  # fmt: skip
        run = partial(
            prune_folder_into, Path(model_dir), method=method, calibration=calibration, label="model_dir",
            options=settings, method_options=method_options, device=None if device is None else torch.device(device),
        )  # fmt: skip
        if ranks is not None and ranks.rank != 0:  # rank 0 writes the folder; the others calibrate beside it
            return run(None, None)
        with folder as staging:
            return run(folder, staging)


def prune_folder_into(
    source: Path,
    folder: AtomicFolder | None,
    staging: Path | None,
    method: str | CalibratedMethod,
    *,
    calibration: Tensor | Iterable[Tensor],
    label: str,
    options: OneShotOptions,
    method_options: dict[str, Any],
    device: torch.device | None = None,
) -> OneShotReport:
    """:func:`oneshot_folder`'s work: prune ``source`` into ``staging``, the open ``folder``'s staging folder.

    ``options.permanent`` is ignored (the folder gets plain weights); ``label`` names ``source`` in errors.
    Under torch.distributed (``options.data_parallel``) the ranks split the
    calibration; a rank other than 0 passes no ``folder`` nor ``staging`` and writes nothing.
    """
    if folder is None or staging is None:
        opened = open_folder(source, None, source, label, blocks=options.blocks, device=device, streamed=ReadBlocks)
    else:
        opened = open_folder(source, folder, staging, label, blocks=options.blocks, device=device)
    settings = dataclasses.replace(options, blocks=opened.blocks_path, permanent=True)
    job = OneShotJob.prepare(
        opened.model, method, calibration=calibration, options=settings, method_options=method_options,
        ranks=Ranks.current(settings.data_parallel),
    )  # fmt: skip
    report = job.run(opened.blocks, progress=options.progress, restore_on_error=False)
    opened.blocks.finish(opened.rest, source)
    return report
