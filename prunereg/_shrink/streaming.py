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
from prunereg._runtime.ranks import Ranks
from prunereg._runtime.streamed import ReadBlocks, StreamedBlocks, empty_block, open_folder
from prunereg._shrink.contract import BlockFollower, ShrinkMethod
from prunereg._shrink.engine import ShrinkJob
from prunereg._shrink.options import ShrinkOptions
from prunereg._shrink.report import ShrinkReport


class ShrunkBlocks(StreamedBlocks):
    """Streamed blocks whose shards hold whatever the block holds after shrinking, renamed when blocks go."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.holders: dict[str, tuple[nn.Module, str]] = {}
        """The module and attribute of each block tensor written, by checkpoint key (to see it taken back)."""

    def done(self, index: int, block: nn.Module, *, pruned: bool) -> None:
        prefix = f"{self.blocks_path}.{index}."
        parameters = {name for name, _ in block.named_parameters()}
        held = self.layout.names()
        tensors = {}
        for name, tensor in block.state_dict().items():
            if prefix + name in held or name in parameters:  # a bias the compensation created is new
                tensors[prefix + name] = tensor
                if prefix + name not in self.layout.converted:
                    module, _, attribute = name.rpartition(".")
                    self.holders[self.layout.key_of(prefix + name)] = (block.get_submodule(module), attribute)
        self._write(index, self.layout.stored(tensors))
        empty_block(block)

    def drop_taken_back(self) -> None:
        """Delete from the shards each tensor its module no longer holds (a bias recovery took back at the end)."""
        gone = {key for key, (module, attribute) in self.holders.items() if getattr(module, attribute, None) is None}
        for shard in sorted({self.weight_map[key] for key in gone}):
            keys = [key for key, file in self.weight_map.items() if file == shard]
            self._rewrite(shard, {key: key for key in keys if key not in gone}, dropped=[k for k in keys if k in gone])

    def drop_and_renumber(self, n_blocks: int, removed: Iterable[int]) -> None:
        """Delete the shards of the ``removed`` blocks and rename the keys of the later ones to their new index."""
        from safetensors import safe_open

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
                self._rewrite(shard, {key: new + key[len(old) :] for key in keys})
            new_index += 1

    def _rewrite(self, shard: str, renamed: dict[str, str], dropped: Iterable[str] = ()) -> None:
        """Write ``shard`` again with the tensors of ``renamed`` under their new names, those ``dropped`` left out."""
        from safetensors import safe_open
        from safetensors.torch import save_file

        path = self.output / shard
        with safe_open(str(path), framework="pt") as handle:
            tensors = {new: handle.get_tensor(key) for key, new in renamed.items()}
            for key in dropped:
                tensor = handle.get_tensor(key)
                self.total_size -= tensor.numel() * tensor.element_size()
        save_file(tensors, str(path), metadata={"format": "pt"})
        for key in [*renamed, *dropped]:
            del self.weight_map[key]
        self.weight_map.update(dict.fromkeys(tensors, shard))

    def _block_key(self, index: int) -> str:
        return self.layout.key_of(f"{self.blocks_path}.{index}.x")[:-1]


def refuse_global_streaming(options: ShrinkOptions) -> None:
    """Refuse ``allocation="global"`` block by block: it needs every block's scores before the first cut."""
    if options.allocation == "global":
        raise ValueError(
            "allocation='global' ranks every block's units before cutting any, which streaming block by block "
            "cannot (it would read the folder twice); shrink in memory with prunereg.shrink"
        )


def shrink_folder_into(
    source: Path,
    folder: AtomicFolder | None,
    staging: Path | None,
    method: str | ShrinkMethod,
    calibration: Tensor | Iterable[Tensor] | None,
    options: ShrinkOptions,
    method_options: dict[str, Any],
    *,
    label: str,
    follower: BlockFollower | None = None,
) -> ShrinkReport:
    """:func:`prunereg.shrink_folder`'s one pass: shrink ``source`` into ``staging``, the open ``folder``'s staging.

    ``follower`` runs on each cut block before its shard is written (recovery),
    as in memory. ``label`` names ``source`` in errors; a failure leaves the
    model half shrunk (``options.restore_on_error`` is not read: the staging
    folder is discarded).

    Under torch.distributed (``options.data_parallel``) the ranks split the
    calibration; a rank that writes nothing passes no ``staging`` (nor
    ``folder``: a folder-less rank that writes, writes a round of its own
    without a free-space check).
    """
    refuse_global_streaming(options)
    kind = ShrunkBlocks if staging is not None else ReadBlocks
    opened = open_folder(source, folder, staging or source, label, blocks=options.blocks, streamed=kind)
    streamed = opened.blocks
    options = dataclasses.replace(options, blocks=opened.blocks_path)
    ranks = Ranks.current(options.data_parallel)
    job = ShrinkJob.prepare(opened.model, method, calibration, options, method_options, follower, ranks=ranks)
    report = job.run(options.progress, streamed, restore_on_error=False)
    if staging is None:
        return report
    assert isinstance(streamed, ShrunkBlocks)
    streamed.drop_taken_back()
    streamed.drop_and_renumber(opened.n_blocks, report.removed_blocks)
    streamed.finish(opened.rest, source)
    shrunk_config: Any = opened.model.config
    config = json.loads(shrunk_config.to_json_string(use_diff=False))
    if is_gguf_marker(config.get("quantization_config")):
        del config["quantization_config"]
    (staging / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return report
