"""A Hugging Face model folder run one decoder block at a time, for models larger than memory.

The model is built empty (parameters on the meta device, buffers real), the
weights outside the blocks (embeddings, final norm, head) are loaded
(:func:`open_folder`), and each block is read from the folder's safetensors
files before it runs and written to the output folder as its own shard after
(:class:`StreamedBlocks`, a :class:`~prunereg._runtime.weights.BlockWeights`),
then emptied again. Peak memory: the weights outside the blocks, one block, and
one block's calibration activations. :meth:`StreamedBlocks.finish` writes the
rest, an index and the input folder's other files (config, tokenizer), so
``from_pretrained`` loads the output; the engines write it through
:class:`~prunereg._disk.folder.AtomicFolder`: whole, or not at all.
"""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from prunereg._disk.errors import quoted
from prunereg._disk.folder import AtomicFolder
from prunereg._disk.input_file import copy_regular
from prunereg._disk.model_dir import (
    SAFETENSORS_INDEX,
    check_model_folder,
    replace_hint,
    safetensors_weight_map,
    weight_headers,
)
from prunereg._disk.safetensors_file import open_safetensors
from prunereg._models.hf_folder import CONFIG_NAME, config_json_without_gguf_marker, empty_causal_lm, refuse_incomplete
from prunereg._models.layout import CheckpointLayout
from prunereg._runtime.blocks import find_blocks

INDEX_NAME = SAFETENSORS_INDEX
_UNTIED = (
    "{label}'s config ties the input and output embeddings, but its weights hold {names} with different values; "
    "they are loaded apart, as transformers loads them (set tie_word_embeddings to false in config.json to say so)"
)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")


class CheckpointReader:
    """The tensors of a folder's safetensors files, read one at a time (the files stay closed in between).

    The files are those transformers reads (``model.safetensors`` before an index).
    """

    def __init__(self, folder: Path, label: str = "MODEL_DIR") -> None:
        self.label = label
        self.folder = folder
        self.files = safetensors_weight_map(folder, label)

    def layout(self, model: nn.Module) -> CheckpointLayout:
        """How these files' tensors make ``model``'s (:class:`CheckpointLayout`), planned from their headers alone."""
        headers = weight_headers(self.folder, self.label)
        assert headers is not None  # safetensors files: safetensors_weight_map refuses any other
        return CheckpointLayout(model, {key: headers.tensors[key] for key in self.files})

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
        self.layout = reader.layout(model)

    def capturing(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # the weights outside the blocks are loaded for the whole run

    def fetch(self, index: int, block: nn.Module) -> None:
        prefix = f"{self.blocks_path}.{index}."
        wanted = [name for name in self.layout.names() if name.startswith(prefix)]
        made = self.layout.assemble(wanted, self.reader.read(self.layout.keys_for(wanted)))
        state = {name[len(prefix) :]: tensor.to(self.device) for name, tensor in made.items()}
        missing = [name for name, _ in block.named_parameters() if name not in state]
        if missing:
            raise KeyError(f"the checkpoint has no weights for {prefix}{missing[0]} (and {len(missing) - 1} more)")
        block.load_state_dict(state, strict=False, assign=True)

    def done(self, index: int, block: nn.Module, *, pruned: bool) -> None:
        if pruned:
            prefix = f"{self.blocks_path}.{index}."
            held = self.layout.names()
            self._write(index, self.layout.stored({prefix + name: t for name, t in block.state_dict().items()
                                                   if prefix + name in held}))  # fmt: skip
        empty_block(block)

    def finish(self, rest: Mapping[str, str], source: Path) -> None:
        """Write the weights outside the blocks unchanged, the index, and the folder's other files.

        ``rest`` maps each name written to the checkpoint key it is read from.
        """
        tensors = self.reader.read(set(rest.values()))
        self._write(self.n_shards - 1, {name: tensors[key] for name, key in rest.items()})
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


def check_complete(
    model: nn.Module,
    layout: CheckpointLayout,
    checkpoint_keys: Iterable[str],
    source: Path,
    label: str,
    also: Iterable[str] = (),
) -> None:
    """Refuse, as loading the folder in memory does, weights the folder lacks or the model does not know.

    ``also``: more model names loaded (a tied embedding under the name the model saves it by).
    """
    found = layout.names() | set(also)
    missing = [name for name, _ in model.named_parameters() if name not in found]  # a tied head is named once
    ignored = [re.compile(pattern) for pattern in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ()]
    used = layout.used_keys()
    unexpected = [k for k in checkpoint_keys if k not in used and not any(p.search(k) for p in ignored)]
    refuse_incomplete(missing, unexpected, source, label)


def tied_embedding_names(model: nn.Module) -> list[str]:
    """The names of the input embedding's weight where the model ties its head to it, the one it saves by first.

    Empty where the config does not tie them (``tie_word_embeddings``) or the built model does not share the tensor.
    """
    config = getattr(model, "config", None)
    tie_weights = getattr(model, "tie_weights", None)
    if not (getattr(config, "tie_word_embeddings", False) and callable(tie_weights)):
        return []
    tie_weights()  # the meta model is built with the pair apart
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()  # type: ignore[operator]
    if inputs is None or outputs is None or inputs.weight is not outputs.weight:
        return []
    return [name for name, parameter in model.named_parameters(remove_duplicate=False) if parameter is inputs.weight]


def tied_embedding_once(
    model: nn.Module, rest: dict[str, str], tensors: Mapping[str, Tensor], label: str
) -> tuple[dict[str, str], dict[str, str], bool]:
    """The weights outside the blocks to load (model name -> key) and to write (name -> key), and whether to tie.

    ``rest`` maps model names to the checkpoint keys read into ``tensors``. A
    folder may hold a tied embedding under any of its names (``save_model``
    keeps the head's): that one tensor is loaded once and written under the
    name the model saves it by. Held under several names with different values,
    the pair is loaded apart, as transformers loads it, with a warning.
    """
    tied = tied_embedding_names(model)
    held = [name for name in tied if name in rest]
    as_read = {key: key for key in rest.values()}
    if not held:
        return rest, as_read, True
    if any(not torch.equal(tensors[rest[held[0]]], tensors[rest[name]]) for name in held[1:]):
        warnings.warn(_UNTIED.format(label=label, names=" and ".join(held)), UserWarning, stacklevel=2)
        return rest, as_read, False
    loaded = {name: key for name, key in rest.items() if name not in held}
    written = {key: key for key in loaded.values()}
    key = loaded[tied[0]] = rest[held[0]]
    written[key if held[0] == tied[0] else tied[0]] = key  # a head-named folder's tensor goes by the embedding's name
    return loaded, written, True


def buffers_to(model: nn.Module, device: torch.device) -> None:
    """Move the model's real buffers (rotary frequencies, say) to ``device``; its meta parameters stay."""
    for module in model.modules():
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and not buffer.is_meta:
                module._buffers[name] = buffer.to(device)


def empty_block(module: nn.Module) -> None:
    """Give the module's parameters back: each becomes a meta tensor of the same shape and dtype."""
    for submodule in module.modules():
        for name, parameter in list(submodule._parameters.items()):
            if parameter is not None:
                meta = torch.empty_like(parameter, device="meta")
                submodule._parameters[name] = nn.Parameter(meta, requires_grad=parameter.requires_grad)


class ReadBlocks(StreamedBlocks):
    """Block weights fetched from a checkpoint folder and never written: a rank that runs beside the one that writes."""

    def done(self, index: int, block: nn.Module, *, pruned: bool) -> None:
        empty_block(block)

    def finish(self, rest: Mapping[str, str], source: Path) -> None:
        """Nothing: another rank writes the output folder."""


@dataclass
class StreamedModel:
    """A folder's model, built empty with the weights outside its blocks loaded, and its blocks to stream."""

    model: nn.Module
    blocks: StreamedBlocks
    blocks_path: str
    n_blocks: int
    rest: dict[str, str]
    """The weights outside the blocks: name written -> checkpoint key (:meth:`StreamedBlocks.finish` copies them)."""


def output_folder(output_dir: str | Path, model_dir: str | Path, *, replace: bool) -> AtomicFolder:
    """The output folder of a run from ``model_dir`` to ``output_dir``, both checked before any staging folder exists.

    ``output_dir`` is refused if it holds files (unless ``replace``) or is or
    holds ``model_dir``; ``model_dir`` if it is no folder prunereg reads (a FIFO, say).
    """
    folder = AtomicFolder(
        output_dir, replace=replace, label="output_dir", replace_hint="pass replace=True to replace it",
        keep={"model_dir": model_dir},
    )  # fmt: skip
    folder.check()
    check_model_folder(Path(model_dir), "model_dir")
    return folder


def open_folder(
    source: Path,
    folder: AtomicFolder | None,
    staging: Path,
    label: str,
    *,
    blocks: str | None = None,
    streamed: type[StreamedBlocks] = StreamedBlocks,
    device: torch.device | None = None,
) -> StreamedModel:
    """``source``'s model built empty with the weights outside its blocks on ``device``; its blocks go to ``staging``.

    ``folder`` (open, ``staging`` its staging folder) is asked for the free
    space of the weights first (None: a rank that writes nothing, its
    ``streamed`` a :class:`ReadBlocks`). Weights the folder lacks or the model does not
    know are refused (:func:`check_complete`); ``label`` names ``source`` in errors.
    """
    check_model_folder(source, label)
    reader = CheckpointReader(source, label)
    if folder is not None:
        folder.require_free_space(reader.size())
    model = empty_causal_lm(source, label)
    blocks_path, block_list = find_blocks(model, blocks)
    streamed_blocks = streamed(model, reader, blocks_path, staging, len(block_list), device)
    layout = streamed_blocks.layout
    outside = [name for name in layout.converted if not name.startswith(f"{blocks_path}.")]
    if outside:
        raise ValueError(
            f"{label} {quoted(source)} stores {outside[0]}, outside the blocks, in a layout transformers converts on "
            "loading; prunereg streams only blocks so stored: load the model in memory"
        )
    rest = {name: key for name, key in layout.plain.items() if not name.startswith(f"{blocks_path}.")}
    tensors = reader.read(rest.values())
    rest, written, ties = tied_embedding_once(model, rest, tensors, label)
    model.load_state_dict({name: tensors[key].to(device) for name, key in rest.items()}, strict=False, assign=True)
    if device is not None:
        buffers_to(model, device)
    del tensors
    tie_weights = getattr(model, "tie_weights", None)
    if ties and callable(tie_weights):  # a head that shares the embedding's weight (the checkpoint stores it once)
        tie_weights()
    check_complete(model, layout, reader.files, source, label, also=rest)
    return StreamedModel(model, streamed_blocks, blocks_path, len(block_list), written)
