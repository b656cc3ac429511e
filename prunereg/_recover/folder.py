"""``prunereg.shrink_folder``: a folder shrunk block by block, with recovery after each cut and in rounds.

One pass is :func:`~prunereg._shrink.streaming.shrink_folder_into`: each block
is read from the folder, cut, recovered by the follower ``prunereg.shrink``'s
``recover=`` uses (:func:`~prunereg._recover.shrinking.follower_for`, against
the dense block's outputs the pass computes) and written as its own shard, so
memory stays one block's. ``steps=k`` runs ``k`` such passes, each reading the
folder the one before wrote: the rounds are
:func:`~prunereg._recover.shrinking.planned_rounds`', as in memory. The passes
before the last write into folders inside the output's staging folder, each
deleted once the next is written, so the output appears whole or not at all.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from prunereg._disk.folder import AtomicFolder
from prunereg._recover.runtime import calibration_ids
from prunereg._recover.shrinking import combined, follower_for, planned_rounds
from prunereg._runtime.options import with_options_signature
from prunereg._runtime.ranks import Ranks, together
from prunereg._runtime.streamed import open_folder, output_folder
from prunereg._shrink.contract import ShrinkMethod
from prunereg._shrink.options import ShrinkOptions
from prunereg._shrink.report import ShrinkReport
from prunereg._shrink.streaming import refuse_global_streaming, shrink_folder_into

#: Settings :func:`shrink_folder` does not take, and why.
FOLDER_REFUSES = {"restore_on_error": "shrink_folder writes a new folder, and a failure leaves none"}


@with_options_signature(ShrinkOptions, leave_out=FOLDER_REFUSES)
def shrink_folder(
    model_dir: str | Path,
    output_dir: str | Path,
    method: str | ShrinkMethod = "flap",
    calibration: Any = None,
    *,
    tokenizer: Any = None,
    num_samples: int | None = None,
    seq_len: int | None = None,
    replace: bool = False,
    **options: Any,
) -> ShrinkReport:
    """Shrink the Hugging Face causal LM in ``model_dir`` block by block into ``output_dir``, never all in memory.

    Arguments as :func:`prunereg.shrink` (a calibration text is tokenised with
    ``tokenizer`` or else ``model_dir``'s own); the weights in ``model_dir`` must be
    safetensors files. ``output_dir`` gets the shrunk weights, one shard per
    kept block, the shrunk config and the folder's other files, so stock
    ``from_pretrained(output_dir)`` loads the smaller model. Peak memory: the
    weights outside the blocks, one block and one block's calibration activations.
    ``recover=`` recovers each block right after its cut, before its shard is
    written, as in memory; ``steps=k`` streams the folder ``k`` times, each
    round reading what the round before wrote (inside the output's staging
    folder: up to twice the shrunk weights on disk for a while).

    ``model_dir`` is read as untrusted input, as :func:`prunereg.oneshot_folder`
    reads it; ``output_dir`` appears only when complete, replacing a folder that
    holds files only with ``replace=True`` and never when it is or holds ``model_dir``.
    """
    settings, method_options = ShrinkOptions.split(options, refused=FOLDER_REFUSES)
    refuse_global_streaming(settings)
    ranks = Ranks.current(settings.data_parallel)
    with together(ranks):  # the others wait at its last exchange until rank 0's folder is in place
        folder = output_folder(output_dir, model_dir, replace=replace)
        if calibration is not None:
            calibration = calibration_ids(
                calibration, tokenizer=tokenizer, num_samples=num_samples, seq_len=seq_len, folder=Path(model_dir),
                label="model_dir",
            )  # fmt: skip
        if ranks is not None and ranks.rank != 0:  # rank 0 writes the folder; the others calibrate beside it
            return StreamedShrink(None, method, calibration, method_options, "model_dir").run(
                Path(model_dir), None, settings
            )
        with folder as staging:
            request = StreamedShrink(folder, method, calibration, method_options, label="model_dir")
            return request.run(Path(model_dir), staging, settings)


@dataclass
class StreamedShrink:
    """What every streamed pass of one request shares: the open output folder, the method, the calibration.

    ``label`` names the source folder in errors (``model_dir``, ``MODEL_DIR``). A rank
    other than 0 under torch.distributed has no ``folder`` and writes no output
    (:meth:`run` without staging): only the rounds before the last, which it
    reads back, into a temporary folder of its own.
    """

    folder: AtomicFolder | None
    method: str | ShrinkMethod
    calibration: Tensor | None
    method_options: dict[str, Any]
    label: str

    def run(self, source: Path, staging: Path | None, settings: ShrinkOptions) -> ShrinkReport:
        """Shrink ``source`` into ``staging`` (the open folder's; None: write no output), recovered, in its rounds."""
        if settings.steps == 1:
            return self._once(source, staging, settings)
        rounds = self._planned_rounds(source, staging, settings)
        reports = []
        # inside the staging folder, or (a rank that writes no output) a temporary folder of this rank's own
        with tempfile.TemporaryDirectory(prefix=".prunereg-rounds-", dir=staging) as passes:
            read_from = source
            for number, each in enumerate(rounds, start=1):
                into = staging if number == len(rounds) else Path(passes) / f"round-{number}"
                if into is not None:
                    into.mkdir(exist_ok=True)
                reports.append(self._once(read_from, into, each))
                if read_from != source:
                    shutil.rmtree(read_from)  # the round before's folder: read, no longer needed
                read_from = into or source
        return combined(reports)

    def _planned_rounds(self, source: Path, staging: Path | None, settings: ShrinkOptions) -> list[ShrinkOptions]:
        """The rounds, the whole request checked on ``source``'s model as streaming builds it (blocks on meta)."""
        refuse_global_streaming(settings)
        opened = open_folder(source, self.folder, staging or source, self.label, blocks=settings.blocks)
        with_path = dataclasses.replace(settings, blocks=opened.blocks_path)
        return planned_rounds(opened.model, self.method, self.calibration, with_path, self.method_options)

    def _once(self, source: Path, into: Path | None, settings: ShrinkOptions) -> ShrinkReport:
        follower = follower_for(settings)
        report = shrink_folder_into(
            source, self.folder, into, self.method, self.calibration, settings, self.method_options,
            label=self.label, follower=follower,
        )  # fmt: skip
        if follower is not None:
            report.recovery = follower.report
        return report
