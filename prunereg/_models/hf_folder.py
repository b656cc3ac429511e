"""Loading a Hugging Face model folder as untrusted input: none of its code, none of its weights made up.

- No code from the folder ever runs: every transformers call passes
  ``trust_remote_code=False``, so a config or tokenizer whose ``auto_map``
  names the folder's own ``.py`` files loads with transformers' built-in
  classes or is refused with a ``ValueError``; transformers never asks on the
  terminal and never reads stdin.
- Nothing outside the folder is read (:func:`prunereg._disk.model_dir.check_links`).
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
import json
import os
import warnings
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from torch import nn

from prunereg._disk.model_dir import check_links, weight_files
from prunereg._progress import library_bars
from prunereg._text import quoted

CONFIG_NAME = "config.json"


def load_config(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> Any:
    """The folder's config, built by transformers' own classes, without a GGUF provenance marker."""
    from transformers import AutoConfig

    check_links(folder, label)
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
            stacklevel=2,
        )
    return config


def is_gguf_marker(quantization_config: object) -> bool:
    """Whether a config's ``quantization_config`` (a dict as read from JSON) names GGUF."""
    return isinstance(quantization_config, dict) and quantization_config.get("quant_method") == "gguf"


def config_json_without_gguf_marker(folder: Path) -> str | None:
    """The text of the folder's ``config.json`` with a GGUF marker left out; ``None`` if it has none."""
    data = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
    if not (isinstance(data, dict) and is_gguf_marker(data.get("quantization_config"))):
        return None
    del data["quantization_config"]
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def load_causal_lm(folder: str | os.PathLike[str], *, dtype: Any = "auto", label: str = "MODEL_DIR") -> nn.Module:
    """The folder's causal LM in eval mode, every weight from the folder, ready to be saved again."""
    from transformers import AutoModelForCausalLM

    config = load_config(folder, label)
    weight_files(folder, label)  # refuses an index naming files outside the folder
    with _no_folder_code(folder, label), library_bars():  # transformers' weights bar stays out of log files
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            folder, config=config, dtype=dtype, trust_remote_code=False, output_loading_info=True
        )
    model, info = loaded
    refuse_incomplete(info["missing_keys"], info["unexpected_keys"], folder, label)
    refuse_unsaveable(model, label)
    return model.eval()


def model_class(config: Any, label: str = "MODEL_DIR") -> Any:
    """The transformers class the config's ``architectures`` names (transformers' own, never the folder's code)."""
    import transformers

    names = getattr(config, "architectures", None) or []
    found = getattr(transformers, names[0], None) if names else None
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        named = f"names {names[0]!r}, which transformers does not have" if names else "names no architecture"
        raise ValueError(f"{label}'s config.json {named}")
    return found


def load_model(folder: str | os.PathLike[str], *, dtype: Any = "auto", label: str = "MODEL_DIR") -> nn.Module:
    """The folder's model (any architecture transformers has, as ``architectures`` names it) in eval mode.

    The checks of :func:`load_causal_lm`: no folder code, nothing outside the folder, no weight made up.
    """
    config = load_config(folder, label)
    cls = model_class(config, label)
    weight_files(folder, label)
    with _no_folder_code(folder, label), library_bars():
        loaded: Any = cls.from_pretrained(
            folder, config=config, dtype=dtype, trust_remote_code=False, output_loading_info=True
        )
    model, info = loaded
    refuse_incomplete(info["missing_keys"], info["unexpected_keys"], folder, label)
    refuse_unsaveable(model, label)
    return model.eval()


def load_tokenizer(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> Any:
    """The folder's tokenizer, built by transformers' own classes."""
    from transformers import AutoTokenizer

    check_links(folder, label)
    with _no_folder_code(folder, label):
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)


def empty_causal_lm(folder: str | os.PathLike[str], label: str = "MODEL_DIR") -> nn.Module:
    """The folder's causal LM with every parameter on the meta device and its buffers computed for real."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    config = load_config(folder, label)
    with init_empty_weights(include_buffers=False), _no_folder_code(folder, label):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
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
