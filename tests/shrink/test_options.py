"""Shrinking's settings come from one options object: the Python signatures, the command's flags and the docs' table."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

import prunereg
from prunereg._shrink.options import ShrinkOptions

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_python_signatures_show_every_setting_with_its_default() -> None:
    defaults = {name: default for name, (default, _) in ShrinkOptions.settings().items()}
    in_memory = inspect.signature(prunereg.shrink).parameters
    assert {name: in_memory[name].default for name in defaults} == defaults
    assert in_memory["method_options"].kind is inspect.Parameter.VAR_KEYWORD
    assert list(in_memory)[:3] == ["model", "method", "calibration"]  # still positional
    folder = inspect.signature(prunereg.shrink_folder).parameters
    refused = ("restore_on_error",)  # a folder written block by block: see FOLDER_REFUSES
    assert not set(refused) & set(folder) and folder["replace"].default is False
    assert {name: folder[name].default for name in defaults if name not in refused} == {
        name: default for name, default in defaults.items() if name not in refused
    }


def test_the_docs_table_lists_every_setting() -> None:
    page = (DOCS / "shrinking.md").read_text()
    for name in ShrinkOptions.names():
        assert f"| `{name}` |" in page


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"mlp": 1.0}, ValueError, r"mlp must be in \[0, 1\)"),
        ({"heads": "half"}, TypeError, "heads must be a number"),
        ({"layers": -1}, ValueError, "layers must be a number of blocks"),
        ({"layers": True}, ValueError, "layers must be a number of blocks"),
        ({"batch_size": 0}, ValueError, "batch_size must be a positive int"),
        ({"matmul_precision": "low"}, ValueError, "matmul_precision"),
        ({"blocks": 3}, TypeError, "blocks must be a module path"),
    ],
)
def test_the_options_object_checks_every_setting(
    settings: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        ShrinkOptions(**settings)  # type: ignore[arg-type]


def test_shrink_folder_refuses_restore_on_error_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="'restore_on_error' is not taken here: shrink_folder writes a new folder"):
        prunereg.shrink_folder(tmp_path, tmp_path / "out", "flap", torch.ones(1, 4), mlp=0.5, restore_on_error=False)
    assert not (tmp_path / "out").exists()


def test_an_unknown_keyword_goes_to_the_method_which_refuses_it() -> None:
    pytest.importorskip("transformers")
    from tests.shrink.models import build

    model = build("llama")
    refusal = r"^method 'magnitude_sp' does not take argument 'bogus' \(it takes: no arguments\)$"
    with pytest.raises(TypeError, match=refusal):
        prunereg.shrink(model, "magnitude_sp", mlp=0.5, bogus=1)
