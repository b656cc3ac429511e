"""Loading a Hugging Face model folder as untrusted input: none of its code, none of its weights made up.

- No code from the folder ever runs: every transformers call passes
  ``trust_remote_code=False``, so a config or tokenizer whose ``auto_map``
  names the folder's own ``.py`` files loads with transformers' built-in
  classes or is refused with a ``ValueError``; transformers never asks on the
  terminal and never reads stdin.
- Nothing outside the folder is read, and nothing in it but regular files of
  the sizes their kinds have: every entry is checked before transformers
  opens any (:func:`prunereg._disk.model_dir.check_model_folder`), so a FIFO
  never blocks a run.
- The config is checked against the weight files' headers before any model is
  built (:mod:`prunereg._models.config_check`): a count or a width the weights
  cannot hold is refused in one line naming the key, never allocated.
- A folder without a tokenizer, or with a tokenizer file that is not JSON, is
  refused naming the file, in place of transformers' words.
- Weights the model has but the folder lacks (transformers would initialise
  them at random) and weights the folder has but the model lacks are refused.
- ``quantization_config`` with ``quant_method: gguf`` over the folder's plain
  tensors records where the weights came from (saving a GGUF-loaded model's
  config writes it); transformers would then refuse to save the model, so the
  marker is dropped when loading, with a warning.

transformers is imported only inside the functions (the ``hf`` extra).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from prunereg._disk.model_dir import (
    CONFIG_NAME,
    TOKENIZER_FILES,
    WeightHeaders,
    check_model_folder,
    read_json,
    weight_files,
    weight_headers,
)
from prunereg._models.config_check import check_config, check_model
from prunereg._models.slimmed import CONFIG_KEY, apply_slimmed_shapes
from prunereg._progress import library_bars
from prunereg._text import quoted

_TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def load_config(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> Any:
    """The folder's config, built by transformers' own classes once checked, without a GGUF provenance marker."""
    return _checked_config(folder, label).config


@dataclass(frozen=True)
class _CheckedConfig:
    """A folder's config as transformers builds it, ``config.json`` as read, and its weights' headers (or None)."""

    config: Any
    raw: Mapping[str, Any]
    headers: WeightHeaders | None

    def check(self, model: nn.Module, label: str) -> None:
        """Refuse ``model``, built from the config with empty weights, where it differs from the weights."""
        quantized = "quantization_config" in self.raw and not is_gguf_marker(self.raw["quantization_config"])
        if self.headers is not None and not quantized:  # a quantized checkpoint stores other shapes
            check_model(model, self.raw, self.headers, label)

    def check_on_meta(self, build: Callable[[Any], nn.Module], folder: str | os.PathLike[str], label: str) -> None:
        """:meth:`check` on what ``build`` makes of a copy of the config on the meta device (nothing allocated)."""
        import torch

        if self.headers is None:
            return
        with torch.device("meta"), _no_folder_code(folder, label):
            model = build(copy.deepcopy(self.config))  # building may set defaults on the config it is given
        self.check(model, label)


def _checked_config(folder: str | os.PathLike[str], label: str) -> _CheckedConfig:
    from transformers import AutoConfig

    raw, headers = check_folder(folder, label)
    with _no_folder_code(folder, label):
        config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    marker = getattr(config, "quantization_config", None)
    if isinstance(marker, dict) and is_gguf_marker(marker):
        del config.quantization_config
        warnings.warn(
            f"{label}'s config.json says its weights came from a GGUF file "
            f"({marker.get('gguf_file', 'unnamed')}); they are plain tensors here, used as they are, and the "
            "marker is left out of what is saved",
            UserWarning,
            stacklevel=3,
        )
    return _CheckedConfig(config, raw, headers)


def check_folder(
    folder: str | os.PathLike[str], label: str, *, config_required: bool = True
) -> tuple[Mapping[str, Any], WeightHeaders | None]:
    """The folder checked (its entries, then ``config.json`` against the weights' headers): the JSON and headers.

    Runs before transformers reads anything of the folder, the config included
    (``AutoTokenizer`` reads it too). Without ``config_required`` a folder with
    no ``config.json`` is not refused here.
    """
    check_model_folder(folder, label)
    if not config_required and not os.path.lexists(Path(folder) / CONFIG_NAME):
        return {}, None
    raw = read_json(folder, CONFIG_NAME, label)
    raw = raw if isinstance(raw, dict) else {}  # transformers says what is wrong with it
    try:
        headers = weight_headers(folder, label)
    except FileNotFoundError:  # a folder of a config alone; loading the model says what is missing
        headers = None
    if headers is not None:
        check_config(raw, headers, label)
    return raw, headers


def is_gguf_marker(quantization_config: object) -> bool:
    """Whether a config's ``quantization_config`` (a dict as read from JSON) names GGUF."""
    return isinstance(quantization_config, dict) and quantization_config.get("quant_method") == "gguf"


def config_json_without_gguf_marker(folder: Path, label: str = "MODEL_DIR") -> str | None:
    """The text of the folder's ``config.json`` with a GGUF marker left out; ``None`` if it has none."""
    data = read_json(folder, CONFIG_NAME, label)
    if not (isinstance(data, dict) and is_gguf_marker(data.get("quantization_config"))):
        return None
    del data["quantization_config"]
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def load_causal_lm(folder: str | os.PathLike[str], *, dtype: Any = "auto", label: str = "MODEL_DIR") -> nn.Module:
    """The folder's causal LM in eval mode, every weight from the folder, ready to be saved again."""
    from transformers import AutoModelForCausalLM

    checked = _checked_config(folder, label)
    checked.check_on_meta(
        lambda config: AutoModelForCausalLM.from_config(config, trust_remote_code=False), folder, label
    )
    return _loaded(AutoModelForCausalLM, checked.config, folder, dtype, label)


def model_class(config: Any, label: str = "MODEL_DIR") -> Any:
    """The transformers class the config's ``architectures`` names (transformers' own, never the folder's code).

    A config that names none is a causal language model's where its
    ``model_type`` has one (as ``prunereg oneshot`` and ``shrink`` load it).
    """
    import transformers

    names = getattr(config, "architectures", None) or []
    if not names and type(config) in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        return transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    found = getattr(transformers, names[0], None) if names else None
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        named = f"names {names[0]!r}, which transformers does not have" if names else "names no architecture"
        raise ValueError(
            f'{label}\'s config.json {named}: set "architectures" to the transformers class of its model '
            '("ResNetForImageClassification", "BertModel", ...)'
        )
    return found


def is_causal_lm(config: Any, cls: Any) -> bool:
    """Whether ``cls`` (:func:`model_class` of ``config``) is a causal language model (``prunereg shrink``'s kind)."""
    import transformers

    mapping = transformers.MODEL_FOR_CAUSAL_LM_MAPPING
    return type(config) in mapping and mapping[type(config)] is cls


def load_model(folder: str | os.PathLike[str], *, dtype: Any = "auto", label: str = "MODEL_DIR") -> nn.Module:
    """The folder's model (any architecture transformers has, as ``architectures`` names it) in eval mode.

    The checks of :func:`load_causal_lm`: no folder code, nothing outside the folder, no weight made up.
    """
    config, cls = checked_model_class(folder, label)
    return _loaded(cls, config, folder, dtype, label)


def checked_model_class(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> tuple[Any, Any]:
    """The folder's config and the class it names, once the model built from them on the meta device fits the weights.

    A folder ``prunereg.slim`` wrote is built with the shapes its config records. So a config unlike its weights
    is refused in prunereg's words before transformers loads anything (and reports the mismatch in a table).
    """
    checked = _checked_config(folder, label)
    cls = model_class(checked.config, label)
    record = getattr(checked.config, CONFIG_KEY, None)

    def build(config: Any) -> nn.Module:
        return apply_slimmed_shapes(cls(config), record) if record else cls(config)

    checked.check_on_meta(build, folder, label)
    return checked.config, cls


def empty_model(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> nn.Module:
    """The folder's model as :func:`load_model` builds it, every tensor on the meta device: no weight is read.

    In the dtype ``from_pretrained`` picks by default: the config's, else the first floating-point weight's.
    """
    import torch

    config, cls = checked_model_class(folder, label)
    if getattr(config, "dtype", None) is None:
        headers = weight_headers(folder, label)
        stored = [entry.dtype for entry in headers.tensors.values()] if headers is not None else []
        config.dtype = next((_FLOATS[code] for code in stored if code in _FLOATS), None)
    record = getattr(config, CONFIG_KEY, None)
    with torch.device("meta"), _no_folder_code(folder, label):
        model = cls._from_config(config)
    return (apply_slimmed_shapes(model, record) if record else model).eval()


_FLOATS = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _loaded(cls: Any, config: Any, folder: str | os.PathLike[str], dtype: Any, label: str) -> nn.Module:
    """``cls.from_pretrained(folder)`` with the checked ``config``, refused unless every weight came from the folder."""
    weight_files(folder, label)  # refuses an index naming files outside the folder
    with _no_folder_code(folder, label), library_bars():  # transformers' weights bar stays out of log files
        loaded: Any = cls.from_pretrained(
            folder, config=config, dtype=dtype, trust_remote_code=False, output_loading_info=True
        )
    model, info = loaded
    refuse_incomplete(info["missing_keys"], info["unexpected_keys"], folder, label)
    refuse_unsaveable(model, label)
    return model.eval()


def load_tokenizer(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> Any:
    """The folder's tokenizer, built by transformers' own classes; a missing or broken one named in one line."""
    from transformers import AutoTokenizer

    check_folder(folder, label, config_required=False)
    try:
        with _no_folder_code(folder, label):
            return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except Exception as error:
        problem = _tokenizer_problem(Path(folder), label, error)
        if problem is None:
            raise
        raise ValueError(problem) from error


def _tokenizer_problem(folder: Path, label: str, error: Exception) -> str | None:
    """Why transformers could not build the folder's tokenizer, in prunereg's words; None if it is not known."""
    for name in _TOKENIZER_JSON:
        if os.path.lexists(folder / name):
            try:
                read_json(folder, name, label)
            except ValueError as not_json:
                return str(not_json)
    present = [name for name in TOKENIZER_FILES if os.path.lexists(folder / name)]
    if not present:
        return (
            f"{label} {quoted(folder)} holds no tokenizer (no tokenizer.json, tokenizer.model or vocabulary file); "
            "copy the model's tokenizer files into it"
        )
    if ("sentencepiece" in str(error) or "tiktoken" in str(error)) and "tokenizer.json" not in present:
        return (
            f"{label}'s tokenizer is {', '.join(present)} without a tokenizer.json, which transformers reads only "
            "with the sentencepiece package (tiktoken for a tiktoken file): pip install sentencepiece, or copy the "
            "model's tokenizer.json into the folder"
        )
    return None


def empty_causal_lm(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> nn.Module:
    """The folder's causal LM with every parameter on the meta device and its buffers computed for real.

    Refused, as :func:`load_causal_lm` refuses it, where its tensors differ from the folder's weights.
    """
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    checked = _checked_config(folder, label)
    with init_empty_weights(include_buffers=False), _no_folder_code(folder, label):
        model = AutoModelForCausalLM.from_config(checked.config, trust_remote_code=False)
    checked.check(model, label)
    return model.eval()


@contextlib.contextmanager
def _no_folder_code(folder: str | os.PathLike[str], label: str) -> Iterator[None]:
    """Turn transformers' refusal to load without the folder's own code into one sentence that says why."""
    try:
        yield
    except ValueError as error:
        if "trust_remote_code" not in str(error):
            raise
        raise ValueError(
            f"{label} {quoted(folder)} needs its own code to load (auto_map in its config or tokenizer config); "
            "prunereg never runs code from a model folder"
        ) from error


def refuse_incomplete(
    missing: Collection[str], unexpected: Collection[str], folder: str | os.PathLike[str], label: str
) -> None:
    """Raise ``ValueError`` naming the weights missing from or unexpected in the folder, if any."""
    problems = []
    for what, names in (("lacks", missing), ("has weights the model does not know", unexpected)):
        if names:
            listed = sorted(names)
            more = f" and {len(listed) - 3} more" if len(listed) > 3 else ""
            problems.append(f"{what}: {', '.join(listed[:3])}{more}")
    if problems:
        hint = (
            "; a folder saved from a pruned model without prunereg.save_pretrained loads with prunereg.from_pretrained"
            if any(name.endswith(("_orig", "_mask")) for name in unexpected)
            else ""
        )
        raise ValueError(f"{label} {quoted(folder)} {'; it '.join(problems)}{hint}")


def refuse_unsaveable(model: nn.Module, label: str) -> None:
    """Raise ``ValueError`` if transformers would refuse to save ``model`` (a quantization it cannot serialise)."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and not quantizer.is_serializable():
        method = getattr(quantizer.quantization_config, "quant_method", "?")
        raise ValueError(
            f"{label}'s model is quantized with {getattr(method, 'value', method)}, which transformers cannot "
            "save; prune a folder of its float weights"
        )
