"""Where a causal language model keeps its decoder blocks, and which of their layers prune.

Every block-by-block engine (one-shot pruning, shrinking) finds the blocks
through :data:`BLOCK_PATHS`, keyed by the ``model_type`` of a Hugging Face
config; a model of another architecture names its blocks with ``blocks=
"path.to.ModuleList"``, and adding a line here supports it for everyone.
Prunable layers are ``nn.Linear`` and GPT-2's ``Conv1D`` (a Linear whose weight
is stored transposed, ``[in, out]``).
"""

from __future__ import annotations

from torch import Tensor, nn

#: Dotted path from a causal LM (``*ForCausalLM``) to its ``nn.ModuleList`` of decoder blocks.
BLOCK_PATHS: dict[str, str] = {
    "llama": "model.layers",
    "mistral": "model.layers",
    "qwen2": "model.layers",
    "qwen3": "model.layers",
    "gemma": "model.layers",
    "gemma2": "model.layers",
    "phi3": "model.layers",
    "gpt2": "transformer.h",
    "opt": "model.decoder.layers",
}


def find_blocks(model: nn.Module, path: str | None = None) -> tuple[str, nn.ModuleList]:
    """The model's decoder blocks and their dotted path, from ``path`` or the model's architecture.

    A base model without its head (``LlamaModel`` rather than ``LlamaForCausalLM``)
    is found too: the path is then tried without its first component.
    """
    if path is not None:
        candidates = [path]
    else:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        known = BLOCK_PATHS.get(model_type) if isinstance(model_type, str) else None
        candidates = [known] if known else list(dict.fromkeys(BLOCK_PATHS.values()))
        candidates += [c.partition(".")[2] for c in candidates]
    for candidate in candidates:
        blocks = _get_submodule(model, candidate)
        if isinstance(blocks, nn.ModuleList) and len(blocks) > 0:
            return candidate, blocks
    name = type(model).__name__
    if path is not None:
        raise BlocksNotFoundError(
            f"blocks={path!r} does not name a non-empty nn.ModuleList of {name}",
            f"--blocks {path} does not name a non-empty nn.ModuleList of {name}",
        )
    raise BlocksNotFoundError(
        f"cannot find the decoder blocks of {name}; pass blocks='path.to.ModuleList' "
        "(see prunereg._runtime.blocks.BLOCK_PATHS)",
        f"cannot find the decoder blocks of {name}; name them with --blocks path.to.ModuleList "
        "(model.encoder.layer, say; see prunereg._runtime.blocks.BLOCK_PATHS)",
    )


class BlocksNotFoundError(ValueError):
    """No decoder blocks where they were looked for; ``command_line_message`` says it in the command's words."""

    def __init__(self, message: str, command_line_message: str) -> None:
        super().__init__(message)
        self.command_line_message = command_line_message


def _get_submodule(model: nn.Module, path: str) -> nn.Module | None:
    if not path:
        return None
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def is_conv1d(module: nn.Module) -> bool:
    """Whether ``module`` is a GPT-2 style ``Conv1D``: a Linear with its weight stored ``[in, out]``."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx")


def prunable_layers(block: nn.Module) -> dict[str, nn.Module]:
    """The block's Linear and Conv1D layers by name relative to the block, in module order."""
    return {
        name: module
        for name, module in block.named_modules()
        if name and (isinstance(module, nn.Linear) or is_conv1d(module))
    }


def weight_matrix(layer: nn.Module) -> Tensor:
    """The layer's weight in Linear's ``[out, in]`` layout (a view for Conv1D)."""
    weight = layer.weight
    assert isinstance(weight, Tensor)
    return weight.T if is_conv1d(layer) else weight


def in_features(layer: nn.Module) -> int:
    """How many inputs the layer reads."""
    return int(weight_matrix(layer).shape[1])
