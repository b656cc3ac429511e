"""One-shot pruning of a Hugging Face model folder one decoder block at a time, for models larger than RAM.

The model is built empty (parameters on the meta device, buffers real), the
weights outside the blocks (embeddings, final norm, head) are loaded, and then
each block is read from the folder's safetensors files, pruned, written to the
output folder as its own shard and emptied again. Peak memory: the weights
outside the blocks, one block, and one block's calibration activations. The
output folder holds the other files of the input folder (config, tokenizer) and
an index, so ``from_pretrained`` loads it. It is written through
:class:`~prunereg._disk.folder.AtomicFolder`: whole, or not at all.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._disk.folder import AtomicFolder
from prunereg._disk.input_file import copy_regular
from prunereg._disk.model_dir import (
    SAFETENSORS_INDEX,
    check_model_folder,
    replace_hint,
    safetensors_weight_map,
)
from prunereg._disk.safetensors_file import open_safetensors
from prunereg._models.config_check import checkpoint_names
from prunereg._models.hf_folder import CONFIG_NAME, config_json_without_gguf_marker, empty_causal_lm, refuse_incomplete
from prunereg._oneshot.blocks import find_blocks
from prunereg._oneshot.calibration import calibration_ids
from prunereg._oneshot.contract import CalibratedMethod
from prunereg._oneshot.engine import OneShotJob
from prunereg._oneshot.options import OneShotOptions, with_options_signature
from prunereg._oneshot.report import OneShotReport

INDEX_NAME = SAFETENSORS_INDEX
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")


class CheckpointReader:
    """The tensors of a folder's safetensors files, read one at a time (the files stay closed in between).

    The files are those transformers reads (``model.safetensors`` before an index).
    """

    def __init__(self, folder: Path, label: str = "MODEL_DIR") -> None:
        self.label = label
        self.files = safetensors_weight_map(folder, label)

    def read(self, keys: Iterable[str]) -> dict[str, Tensor]:
        """The tensors named ``keys``, each file opened once, through the checked opener."""
        by_file: dict[Path, list[str]] = {}
        for key in keys:
            by_file.setdefault(self.files[key], []).append(key)
        tensors = {}
        for path, names in by_file.items():
            with open_safetensors(path, replace_hint(path.name)) as handle:
                for name in names:
                    tensors[name] = handle.get_tensor(name)
        return tensors

    def size(self) -> int:
        """The bytes of the weight files read."""
        return sum(path.stat().st_size for path in set(self.files.values()))


class StreamedBlocks:
    """Block weights fetched from a checkpoint folder and, once pruned, written as one shard per block."""

    def __init__(
        self,
        model: nn.Module,
        reader: CheckpointReader,
        blocks_path: str,
        output: Path,
        n_blocks: int,
        device: torch.device | None = None,
    ):
        self.reader = reader
        self.device = device
        self.blocks_path = blocks_path
        self.output = output
        self.n_shards = n_blocks + 1  # one per block, and one for the rest
        self.weight_map: dict[str, str] = {}
        self.total_size = 0
        self.names = checkpoint_names(model, reader.files)

    def fetch(self, index: int, block: nn.Module) -> None:
        prefix = f"{self.blocks_path}.{index}."
        wanted = {name[len(prefix) :]: key for name, key in self.names.items() if name.startswith(prefix)}
        tensors = self.reader.read(wanted.values())
        state = {local: tensors[key].to(self.device) for local, key in wanted.items()}
        missing = [name for name, _ in block.named_parameters() if name not in state]
        if missing:
            raise KeyError(f"the checkpoint has no weights for {prefix}{missing[0]} (and {len(missing) - 1} more)")
        block.load_state_dict(state, strict=False, assign=True)

    def done(self, index: int, block: nn.Module, *, pruned: bool) -> None:
        if pruned:
            prefix = f"{self.blocks_path}.{index}."
            self._write(index, {self.names[prefix + name]: t for name, t in block.state_dict().items()
                                if prefix + name in self.names})  # fmt: skip
        _empty(block)

    def finish(self, rest: Sequence[str], source: Path) -> None:
        """Write the weights outside the blocks unchanged, the index, and the folder's other files."""
        self._write(self.n_shards - 1, self.reader.read(rest))
        index = {"metadata": {"total_size": self.total_size}, "weight_map": dict(sorted(self.weight_map.items()))}
        (self.output / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        for path in sorted(source.iterdir()):
            if path.is_file() and path.name != INDEX_NAME and not path.name.endswith(_WEIGHT_SUFFIXES):
                copy_regular(path, self.output / path.name, "file of a model folder", "remove it from the folder")
        config = config_json_without_gguf_marker(source, self.reader.label)
        if config is not None:
            (self.output / CONFIG_NAME).write_text(config, encoding="utf-8")

    def _write(self, shard: int, tensors: dict[str, Tensor]) -> None:
        from safetensors.torch import save_file

        name = f"model-{shard + 1:05d}-of-{self.n_shards:05d}.safetensors"
        host = {k: t.detach().to("cpu").contiguous() for k, t in tensors.items()}
        save_file(host, str(self.output / name), metadata={"format": "pt"})
        for key, tensor in tensors.items():
            self.weight_map[key] = name
            self.total_size += tensor.numel() * tensor.element_size()


def _refuse_incomplete(
    model: nn.Module, names: dict[str, str], checkpoint_keys: Iterable[str], source: Path, label: str
) -> None:
    """Refuse, as loading the folder in memory does, weights the folder lacks or the model does not know."""
    found = set(names)
    missing = [name for name, _ in model.named_parameters() if name not in found]  # a tied head is named once
    ignored = [re.compile(pattern) for pattern in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ()]
    used = set(names.values())
    unexpected = [k for k in checkpoint_keys if k not in used and not any(p.search(k) for p in ignored)]
    refuse_incomplete(missing, unexpected, source, label)


def _buffers_to(model: nn.Module, device: torch.device) -> None:
    """Move the model's real buffers (rotary frequencies, say) to ``device``; its meta parameters stay."""
    for module in model.modules():
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and not buffer.is_meta:
                module._buffers[name] = buffer.to(device)


def _empty(module: nn.Module) -> None:
    """Give the module's parameters back: each becomes a meta tensor of the same shape and dtype."""
    for submodule in module.modules():
        for name, parameter in list(submodule._parameters.items()):
            if parameter is not None:
                meta = torch.empty_like(parameter, device="meta")
                submodule._parameters[name] = nn.Parameter(meta, requires_grad=parameter.requires_grad)


#: The settings :func:`oneshot_folder` does not take, and why.
FOLDER_REFUSES = {
    "permanent": "oneshot_folder writes plain pruned weights (permanent=True)",
    "restore_on_error": "oneshot_folder writes a new folder, which a failure leaves out; model_dir is never changed",
}


@with_options_signature(leave_out=FOLDER_REFUSES)
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
    folder = AtomicFolder(
        output_dir, replace=replace, label="output_dir", replace_hint="pass replace=True to replace it",
        keep={"model_dir": model_dir},
    )  # fmt: skip
    folder.check()
    check_model_folder(Path(model_dir), "model_dir")  # a FIFO or worse refused before the staging folder
    calibration = calibration_ids(
        calibration, tokenizer=tokenizer, num_samples=num_samples, seq_len=seq_len, folder=Path(model_dir),
        label="model_dir",
    )  # fmt: skip
    with folder as staging:
        return prune_folder_into(
            Path(model_dir), folder, staging, method, calibration=calibration, label="model_dir",
            options=settings, method_options=method_options, device=None if device is None else torch.device(device),
        )  # fmt: skip


def prune_folder_into(
    source: Path,
    folder: AtomicFolder,
    staging: Path,
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
    """
    check_model_folder(source, label)
    reader = CheckpointReader(source, label)
    folder.require_free_space(reader.size())
    model = empty_causal_lm(source, label)
    blocks_path, block_list = find_blocks(model, options.blocks)
    streamed = StreamedBlocks(model, reader, blocks_path, staging, len(block_list), device)
    rest = {name: key for name, key in streamed.names.items() if not name.startswith(f"{blocks_path}.")}
    tensors = reader.read(rest.values())
    model.load_state_dict({name: tensors[key].to(device) for name, key in rest.items()}, strict=False, assign=True)
    if device is not None:
        _buffers_to(model, device)
    del tensors
    tie_weights = getattr(model, "tie_weights", None)
    if callable(tie_weights):  # a head that shares the embedding's weight (the checkpoint stores it once)
        tie_weights()
    _refuse_incomplete(model, streamed.names, reader.files, source, label)
    settings = dataclasses.replace(options, blocks=blocks_path, permanent=True)
    job = OneShotJob.prepare(model, method, calibration=calibration, options=settings, method_options=method_options)
    report = job.run(streamed, progress=options.progress, restore_on_error=False)
    streamed.finish(list(rest.values()), source)
    return report
