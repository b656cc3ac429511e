"""Shrinking a Hugging Face model folder one decoder block at a time, for models larger than memory.

The streaming of :mod:`prunereg._runtime.streamed`: the model is built empty,
the weights outside the blocks are loaded, and each block is read from the
folder's safetensors files, shrunk, written as its own shard and emptied again.
What differs is the output's shape: a block's shard holds its cut tensors (and
the biases a bias compensation creates), blocks removed at the end have their
shards deleted and the blocks after them are renamed to their new indices, and
``config.json`` is the shrunk model's. The output folder is written through
:class:`~prunereg._disk.folder.AtomicFolder`: whole, or not at all.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from prunereg._disk.folder import AtomicFolder
from prunereg._models.hf_folder import CONFIG_NAME, is_gguf_marker
from prunereg._runtime.calibration import calibration_ids
from prunereg._runtime.options import with_options_signature
from prunereg._runtime.streamed import StreamedBlocks, empty_block, open_folder, output_folder
from prunereg._shrink.contract import ShrinkMethod
from prunereg._shrink.engine import ShrinkJob
from prunereg._shrink.options import ShrinkOptions
from prunereg._shrink.report import ShrinkReport


class ShrunkBlocks(StreamedBlocks):
    """Streamed blocks whose shards hold whatever the block holds after shrinking, renamed when blocks go."""

    def done(self, index: int, block: nn.Module, *, pruned: bool) -> None:
        prefix = f"{self.blocks_path}.{index}."
        parameters = {name for name, _ in block.named_parameters()}
        tensors = {
            self.key_of(prefix + name): tensor
            for name, tensor in block.state_dict().items()
            if prefix + name in self.names or name in parameters  # a bias the compensation created is new
        }
        self._write(index, tensors)
        empty_block(block)

    def key_of(self, name: str) -> str:
        """The checkpoint key of model name ``name``, also for a tensor the checkpoint did not have."""
        if name in self.names:
            return self.names[name]
        strips = any(key != model_name for model_name, key in self.names.items())
        return name.partition(".")[2] if strips else name  # a checkpoint without the base model's prefix

    def drop_and_renumber(self, n_blocks: int, removed: Iterable[int]) -> None:
        """Delete the shards of the ``removed`` blocks and rename the keys of the later ones to their new index."""
        from safetensors import safe_open
        from safetensors.torch import save_file

        gone = set(removed)
        new_index = 0
        for index in range(n_blocks):
            shard = f"model-{index + 1:05d}-of-{self.n_shards:05d}.safetensors"
            path = self.output / shard
            keys = [key for key, file in self.weight_map.items() if file == shard]
            if index in gone:
                with safe_open(str(path), framework="pt") as handle:
                    for key in keys:
                        tensor = handle.get_tensor(key)
                        self.total_size -= tensor.numel() * tensor.element_size()
                        del self.weight_map[key]
                path.unlink()
                continue
            if new_index != index:
                old, new = self._block_key(index), self._block_key(new_index)
                with safe_open(str(path), framework="pt") as handle:
                    tensors = {new + key[len(old) :]: handle.get_tensor(key) for key in keys}
                save_file(tensors, str(path), metadata={"format": "pt"})
                for key in keys:
                    del self.weight_map[key]
                self.weight_map.update(dict.fromkeys(tensors, shard))
            new_index += 1

    def _block_key(self, index: int) -> str:
        return self.key_of(f"{self.blocks_path}.{index}.x")[:-1]


#: Settings :func:`shrink_folder` does not take, and why.
FOLDER_REFUSES = {
    "restore_on_error": "shrink_folder writes a new folder, and a failure leaves none",
    "recover": "recovery block by block from a folder is not built yet: shrink the folder, load it and run "
    "prunereg.recover with the original as the teacher, or shrink in memory with prunereg.shrink",
    "steps": "rounds of shrinking re-read the folder each round: shrink in memory with prunereg.shrink",
}


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

    ``model_dir`` is read as untrusted input, as :func:`prunereg.oneshot_folder`
    reads it; ``output_dir`` appears only when complete, replacing a folder that
    holds files only with ``replace=True`` and never when it is or holds ``model_dir``.
    """
    settings, method_options = ShrinkOptions.split(options, refused=FOLDER_REFUSES)
    refuse_global_streaming(settings)
    folder = output_folder(output_dir, model_dir, replace=replace)
    if calibration is not None:
        calibration = calibration_ids(
            calibration, tokenizer=tokenizer, num_samples=num_samples, seq_len=seq_len, folder=Path(model_dir),
            label="model_dir",
        )  # fmt: skip
    with folder as staging:
        return shrink_folder_into(
            Path(model_dir), folder, staging, method, calibration, settings, method_options, label="model_dir"
        )


def refuse_global_streaming(options: ShrinkOptions) -> None:
    """Refuse ``allocation="global"`` block by block: it needs every block's scores before the first cut."""
    if options.allocation == "global":
        raise ValueError(
            "allocation='global' ranks every block's units before cutting any, which streaming block by block "
            "cannot (it would read the folder twice); shrink in memory with prunereg.shrink"
        )


def shrink_folder_into(
    source: Path,
    folder: AtomicFolder,
    staging: Path,
    method: str | ShrinkMethod,
    calibration: Tensor | Iterable[Tensor] | None,
    options: ShrinkOptions,
    method_options: dict[str, Any],
    *,
    label: str,
) -> ShrinkReport:
    """:func:`shrink_folder`'s work: shrink ``source`` into ``staging``, the open ``folder``'s staging folder.

    ``label`` names ``source`` in errors; a failure leaves the model half shrunk
    (``options.restore_on_error`` is not read: the staging folder is discarded).
    """
    refuse_global_streaming(options)
    opened = open_folder(source, folder, staging, label, blocks=options.blocks, streamed=ShrunkBlocks)
    streamed = opened.blocks
    assert isinstance(streamed, ShrunkBlocks)
    options = dataclasses.replace(options, blocks=opened.blocks_path)
    job = ShrinkJob.prepare(opened.model, method, calibration, options, method_options)
    report = job.run(options.progress, streamed, restore_on_error=False)
    streamed.drop_and_renumber(opened.n_blocks, report.removed_blocks)
    streamed.finish(opened.rest, source)
    shrunk_config: Any = opened.model.config
    config = json.loads(shrunk_config.to_json_string(use_diff=False))
    if is_gguf_marker(config.get("quantization_config")):
        del config["quantization_config"]
    (staging / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return report
