"""The tiny model folder made hostile: configs that ask for more than, or other than, what its weights hold.

Each case is ``(changes to config.json, the refusal after "MODEL_DIR's config.json ")``; every refusal ends
with :data:`FIX`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.tiny_lm import save_tiny_llama_folder

FIX = "use the config.json that came with these weights"
BEYOND_THE_WEIGHTS = [
    ({"num_hidden_layers": 10**9},
     "gives num_hidden_layers 1000000000, but model.safetensors holds 2 blocks (model.layers.0 to model.layers.1) "
     "in 21 tensors; fix num_hidden_layers or "),
    ({"hidden_size": 2**40},
     "gives hidden_size 1099511627776, but no tensor in model.safetensors is that large (the largest dimension is "
     "64); fix hidden_size or "),
    ({"intermediate_size": 4096},
     "gives intermediate_size 4096, but no tensor in model.safetensors is that large (the largest dimension is 64); "
     "fix intermediate_size or "),
]  # fmt: skip
"""Refused before transformers reads the config: building the model would cost what the weights cannot back."""
UNLIKE_THE_WEIGHTS = [
    ({"hidden_size": 40, "head_dim": 10},
     "gives hidden_size 40, but model.safetensors holds model.embed_tokens.weight as [64, 32], not [64, 40]; "
     "fix hidden_size or "),
    ({"num_hidden_layers": 3},
     "gives num_hidden_layers 3, but model.safetensors holds 2 blocks (model.layers.0 to model.layers.1); "
     "fix num_hidden_layers or "),
    ({"hidden_size": 48},
     "gives hidden_size 48 and intermediate_size 48, but model.safetensors holds model.embed_tokens.weight as "
     "[64, 32], not [64, 48]; "),
]  # fmt: skip
"""Refused on the model built on the meta device, before any weight is loaded."""


def saved_tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama's folder in a new temporary folder (for a module-scoped fixture: copy it before changing it)."""
    folder = tmp_path_factory.mktemp("template") / "model"
    save_tiny_llama_folder(folder)
    return folder


def edit_config(model: Path, **changes: object) -> None:
    """Set ``changes`` in the folder's config.json."""
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **changes}))
