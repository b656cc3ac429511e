"""``prunereg.slim_folder``: slim a Hugging Face model folder tensor by tensor, never the whole model in memory.

The model is built on the meta device from the folder's config (shapes, no
values): the graph, the dependency groups and the cut come from it, as
:func:`~prunereg._slim.engine.slim` plans them for a model in memory. The
importance is measured by reading the folder's safetensors files one tensor at
a time (``magnitude``: the same per-unit sums as in memory, so the same units
go; ``random`` draws as it does in memory). Then every tensor is read again,
sliced to its kept positions and written straight into a safetensors file
(:class:`~prunereg._disk.safetensors_file.SafetensorsWriter`), in the shards
``save_pretrained`` makes of the slimmed model, with the config (the slimmed
widths stated, or the record of shapes) and the files beside the weights.
Peak memory: the graph and a few copies of the largest tensor.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._disk.folder import AtomicFolder
from prunereg._disk.input_file import copy_regular
from prunereg._disk.model_dir import SAFETENSORS_INDEX, replace_hint
from prunereg._disk.safetensors_file import SafetensorsWriter
from prunereg._models.hf_folder import empty_model
from prunereg._models.layout import CheckpointLayout
from prunereg._runtime.streamed import CheckpointReader, check_complete, output_folder
from prunereg._slim.engine import ArgumentError, SlimArguments, _importance_name, check_arguments, slim_keeping
from prunereg._slim.importance import Importance, MagnitudeImportance, RandomImportance
from prunereg._slim.report import SlimReport
from prunereg._slim.units import Group, TensorDim

BESIDE_THE_WEIGHTS = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "preprocessor_config.json",
)  # fmt: skip
"""Files a model folder holds besides its config and weights, copied as they are."""

MAX_SHARD_SIZE = "50GB"
"""The largest weight file, as ``save_pretrained`` shards by default."""


def slim_folder(
    model_dir: str | Path,
    output_dir: str | Path,
    *,
    ratio: float | None = None,
    importance: str | Importance | None = None,
    ignore: Sequence[str] = (),
    round_to: int = 1,
    grouped: str = "whole",
    replace: bool = False,
) -> SlimReport:
    """Slim the Hugging Face model in ``model_dir`` into ``output_dir`` tensor by tensor, never all in memory.

    As :func:`prunereg.slim` with a ratio, on the model the folder's config
    describes (``ignore``: module names): the same units go as when the model is
    loaded and slimmed in memory, by ``importance="magnitude"`` (the default)
    or ``"random"`` (seed it with ``torch.manual_seed``); an importance that
    needs the model's values in memory (``taylor``'s gradients, one's own) is
    refused. The weights must be safetensors files. ``output_dir`` gets the
    slimmed weights in the files ``save_pretrained`` would write, the config
    with the slimmed widths (checked by the shapes of a model built from it;
    else the record :func:`prunereg.from_pretrained` applies), and the
    tokenizer and preprocessor files. Read as untrusted, written whole or not
    at all, as :func:`prunereg.oneshot_folder`.
    """
    check_streamed_arguments(ratio, importance, ignore, round_to, grouped)
    folder = output_folder(output_dir, model_dir, replace=replace)
    with folder as staging:
        return slim_folder_into(
            Path(model_dir), folder, staging, "model_dir", SlimArguments(ratio, importance, ignore, round_to, grouped)
        )


def check_streamed_arguments(
    ratio: float | None, importance: str | Importance | None, ignore: Sequence[str], round_to: int, grouped: str
) -> None:
    """:func:`~prunereg._slim.engine.check_arguments`, and what a streamed slim cannot do (before any reading)."""
    check_arguments(ratio, importance, list(ignore), round_to, grouped)
    _check_transformers_writes_layouts()
    if ratio is None:
        raise ArgumentError(
            lambda say: (
                f"slimming by the folder's masks reads them with the whole model in memory: give {say('ratio')}, "
                "or slim it without streaming"
            )
        )
    if type(_streamed_importance(importance)) not in (_MeasuredAsRead, RandomImportance):
        name = importance if isinstance(importance, str) else type(importance).__name__
        raise ArgumentError(
            lambda say: (
                f"{say('importance', name)} ranks by the model's values in memory (taylor by its "
                "gradients); a folder slimmed streamed ranks by magnitude or random"
            )
        )


def _check_transformers_writes_layouts() -> None:
    """The shards are laid out by transformers' own ``save_pretrained`` helpers, which transformers 5 introduced."""
    try:
        from transformers.modeling_utils import remove_tied_weights_from_state_dict, revert_weight_conversion  # noqa: F401
    except ImportError:
        import transformers

        raise ImportError(
            f"slimming a folder streamed writes the shards as transformers 5's save_pretrained does; transformers "
            f"{transformers.__version__} is installed: pip install 'transformers>=5', or slim without streaming"
        ) from None


def _streamed_importance(importance: str | Importance | None) -> Importance:
    """The importance a streamed slim ranks by: magnitude measured as the folder is read, random, or another."""
    from prunereg._slim.importance import resolve_importance

    resolved = resolve_importance(importance or "magnitude")
    return _MeasuredAsRead() if type(resolved) is MagnitudeImportance else resolved


class _MeasuredAsRead(MagnitudeImportance):
    """``magnitude`` of tensors added as the folder is read (:meth:`add`), not of values in memory."""

    def add(self, name: str, tensor: Tensor) -> None:
        self._squares.add(name, tensor)

    def prepare(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Nothing: the tensors were measured as they were read."""

    def __call__(self, group: Group, values: Mapping[str, Tensor]) -> Tensor:
        return self._squares.unit_sums(group).sqrt()


def slim_folder_into(
    source: Path,
    folder: AtomicFolder,
    staging: Path,
    label: str,
    arguments: SlimArguments,
    *,
    max_shard_size: int | str = MAX_SHARD_SIZE,
) -> SlimReport:
    """:func:`slim_folder`'s work, its arguments checked: slim ``source`` into ``staging``, ``folder``'s staging folder.

    ``label`` names ``source`` in errors.
    """
    model = empty_model(source, label)
    reader = CheckpointReader(source, label)
    folder.require_free_space(reader.size())
    layout = reader.layout(model)
    check_complete(model, layout, reader.files, source, label)
    aliases = _aliases(model)
    held = _held_names(aliases, layout)
    scorer = _streamed_importance(arguments.importance)
    if isinstance(scorer, _MeasuredAsRead):
        for name, tensor in _parameters_as_read(model, reader, layout, held):
            scorer.add(name, tensor)
    inputs = {name: value.to("meta") for name, value in example_inputs(model, label).items()}
    report, keep = slim_keeping(model, inputs, dataclasses.replace(arguments, importance=scorer), config_by_shapes=True)
    report = dataclasses.replace(report, importance=_importance_name(arguments.importance or "magnitude"))
    _write_weights(model, reader, layout, _kept_under_every_name(aliases, keep), staging, max_shard_size)
    _write_configs(model, source, staging)
    copy_beside_the_weights(source, staging)
    return report


def _aliases(model: nn.Module) -> list[list[str]]:
    """The names of each parameter and buffer of ``model`` (several for a tied one)."""
    aliases: dict[int, list[str]] = {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        aliases.setdefault(id(tensor), []).append(name)
    return list(aliases.values())


def _held_names(aliases: list[list[str]], layout: CheckpointLayout) -> dict[str, str]:
    """Every parameter and buffer name (tied ones under each name) to the name the checkpoint holds it under."""
    held_names = layout.names()
    held: dict[str, str] = {}
    for same in aliases:
        found = next((name for name in same if name in held_names), None)
        if found is not None:
            held.update(dict.fromkeys(same, found))
    return held


def _kept_under_every_name(aliases: list[list[str]], keep: Mapping[TensorDim, Tensor]) -> dict[TensorDim, Tensor]:
    """``keep`` with a tied tensor's kept positions under each of its names (the plan names it once)."""
    tied = {name: same for same in aliases if len(same) > 1 for name in same}
    every = dict(keep)
    for (name, dim), positions in keep.items():
        every.update({(alias, dim): positions for alias in tied.get(name, ())})
    return every


def _parameters_as_read(
    model: nn.Module, reader: CheckpointReader, layout: CheckpointLayout, held: Mapping[str, str]
) -> Iterator[tuple[str, Tensor]]:
    """Each parameter (under every name it has) as loading would make it: read, in the model's dtype; one at a time.

    (Tensors converted together, a mixture's experts, are read together.)
    """
    by_held: dict[str, list[tuple[str, torch.dtype]]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        by_held.setdefault(held[name], []).append((name, parameter.dtype))
    made: dict[str, Tensor] = {}
    for source, named in by_held.items():
        if source not in made:
            made |= layout.assemble(layout.together(source), reader.read(layout.keys_for([source])))
        stored = made.pop(source)
        for name, dtype in named:
            yield name, stored.to(dtype)
        del stored  # not alive while the next one is read


def _write_weights(
    model: Any,
    reader: CheckpointReader,
    layout: CheckpointLayout,
    keep: Mapping[TensorDim, Tensor],
    staging: Path,
    max_shard_size: int | str,
) -> None:
    """The slimmed model's state as ``save_pretrained`` writes it, each tensor read, sliced and written on its own.

    Tensors are stored in the checkpoint's layout (:meth:`CheckpointLayout.stored`):
    a mixture's experts converted back to modules of their own where the
    checkpoint held them so, cut together and kept until written.
    """
    from huggingface_hub import split_torch_state_dict_into_shards
    from transformers.core_model_loading import dot_natural_key
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    state = remove_tied_weights_from_state_dict(model.state_dict(), model)
    made_by: dict[str, tuple[str, ...]] = {}
    stored_state: dict[str, Tensor] = {}  # in save_pretrained's order, which its shards follow
    planned: set[str] = set()
    for name in sorted(state, key=dot_natural_key):
        if name in planned:
            continue
        together = tuple(layout.together(name))
        planned.update(together)
        for key, tensor in layout.stored({n: state[n] for n in together}).items():
            stored_state[key] = tensor
            made_by[key] = together
    split = split_torch_state_dict_into_shards(
        stored_state, filename_pattern="model{suffix}.safetensors", max_shard_size=max_shard_size
    )
    waiting: dict[str, Tensor] = {}
    for filename, tensor_names in split.filename_to_tensors.items():
        entries = {name: (stored_state[name].dtype, tuple(stored_state[name].shape)) for name in tensor_names}
        with SafetensorsWriter(staging / filename, entries, {"format": "pt"}) as writer:
            for key in writer.order:
                if key not in waiting:
                    waiting.update(_read_and_cut(made_by[key], reader, layout, state, keep))
                writer.write(key, waiting.pop(key))
    if split.is_sharded:
        weight_map = {name: filename for filename, names in split.filename_to_tensors.items() for name in names}
        metadata = {"total_parameters": sum(p.numel() for p in model.parameters()), **split.metadata}
        index = {"metadata": metadata, "weight_map": weight_map}
        (staging / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _read_and_cut(
    names: Sequence[str],
    reader: CheckpointReader,
    layout: CheckpointLayout,
    state: Mapping[str, Tensor],
    keep: Mapping[TensorDim, Tensor],
) -> dict[str, Tensor]:
    """The model tensors ``names`` (read and converted together) read, cut, and stored as the checkpoint held them."""
    read = layout.assemble(names, reader.read(layout.keys_for(names)))
    return layout.stored({name: _kept(read.pop(name).to(state[name].dtype), name, keep) for name in names})


def _kept(tensor: Tensor, name: str, keep: Mapping[TensorDim, Tensor]) -> Tensor:
    """``tensor`` with only the positions slimming kept along each of its dimensions."""
    for dim in range(tensor.dim()):
        positions = keep.get((name, dim))
        if positions is not None:
            tensor = tensor.index_select(dim, positions)
    return tensor


def _write_configs(model: Any, source: Path, staging: Path) -> None:
    """``config.json`` (and a generative model's ``generation_config.json``) as ``save_pretrained`` writes them."""
    config = model.config
    config.dtype = str(model.dtype).removeprefix("torch.")
    config.architectures = [type(model).__name__]
    config.save_pretrained(staging)
    if model.can_generate():
        if (source / "generation_config.json").is_file():
            from transformers import GenerationConfig

            model.generation_config = GenerationConfig.from_pretrained(source)
        model.generation_config.save_pretrained(staging)


def copy_beside_the_weights(source: Path, staging: Path) -> None:
    """Copy the tokenizer and preprocessor files of ``source`` (:data:`BESIDE_THE_WEIGHTS`) into ``staging``."""
    for name in BESIDE_THE_WEIGHTS:
        path = source / name
        if path.is_file() and not path.is_symlink():
            copy_regular(path, staging / name, "file of a model folder", replace_hint(name))


def example_inputs(model: Any, label: str = "MODEL_DIR") -> dict[str, Tensor]:
    """An input the model's config describes: 16 token ids, or one image of its size; ``label`` names the folder."""
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
    raise ValueError(f"{label}'s model takes {name!r}, for which prunereg slim cannot make an input")
