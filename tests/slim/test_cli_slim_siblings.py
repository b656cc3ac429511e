"""`prunereg slim` on language-model folders, and as a sibling of `oneshot` and `shrink` (issue 32 items 4 and 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import prunereg
from prunereg._cli import main
from prunereg._cli.slim import EXAMPLES
from tests.support import slim_models

pytest.importorskip("transformers")

DOCS = Path(__file__).parents[2] / "docs"


def _lm_folder(tmp_path: Path, **config: object) -> Path:
    from tests.support.tiny_lm import save_tiny_llama_folder, tiny_llama

    folder = tmp_path / "lm"
    save_tiny_llama_folder(folder)
    if config:
        tiny_llama(0, **config).save_pretrained(folder)
    return folder


def _invoke(*args: str) -> object:
    return CliRunner().invoke(main, ["slim", *args])


def test_a_language_model_whose_new_widths_no_config_can_state_slims_and_reloads(tmp_path: Path) -> None:
    # 9 heads of width 4 over a hidden size of 36: at 0.3 the hidden size (25) is no multiple of the heads (6)
    folder = _lm_folder(tmp_path, hidden_size=36, num_attention_heads=9, num_key_value_heads=3, head_dim=4)
    result = _invoke(str(folder), str(tmp_path / "out"), "--ratio", "0.3")
    assert result.exit_code == 0, result.output
    assert "prunereg shrink" in result.stderr and "keeps the residual width" in result.stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["hidden_size"] == 36 and "prunereg_slimmed" in config  # the shapes recorded, not stated
    from transformers import LlamaForCausalLM

    reloaded = prunereg.from_pretrained(LlamaForCausalLM, tmp_path / "out")
    assert reloaded.model.embed_tokens.weight.shape[1] == 25


def test_a_causal_lm_config_naming_no_architecture_loads_as_oneshot_and_shrink_load_it(tmp_path: Path) -> None:
    folder = _lm_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["architectures"]
    (folder / "config.json").write_text(json.dumps(config))
    result = _invoke(str(folder), str(tmp_path / "out"), "--ratio", "0.25")
    assert result.exit_code == 0, result.output


def test_another_config_naming_no_architecture_is_refused_saying_what_to_set(tmp_path: Path) -> None:
    model, _ = slim_models.hf_vit()
    model.save_pretrained(tmp_path / "vit")
    config = json.loads((tmp_path / "vit" / "config.json").read_text())
    del config["architectures"]
    (tmp_path / "vit" / "config.json").write_text(json.dumps(config))
    result = _invoke(str(tmp_path / "vit"), str(tmp_path / "out"), "--ratio", "0.25")
    assert result.exit_code == 1 and 'names no architecture: set "architectures"' in result.output
    assert not (tmp_path / "out").exists()


def test_eval_prints_the_perplexity_before_and_after_as_oneshot_and_shrink_do(tmp_path: Path) -> None:
    from tests.support.tiny_lm import random_text

    folder = _lm_folder(tmp_path)
    (tmp_path / "test.txt").write_text(random_text(300, seed=4))
    result = _invoke(str(folder), str(tmp_path / "out"), "--ratio", "0.25", "--eval", str(tmp_path / "test.txt"),
                     "--eval-window", "32", "--json", "--quiet")  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["perplexity_before"] > 1 and report["perplexity_after"] > 1 and report["removed"] > 0


def test_taylor_takes_its_gradient_from_the_calibration_text(tmp_path: Path) -> None:
    from tests.support.tiny_lm import random_text

    folder = _lm_folder(tmp_path)
    (tmp_path / "text.txt").write_text(random_text(300, seed=5))
    text = str(tmp_path / "text.txt")
    result = _invoke(str(folder), str(tmp_path / "out"), "--ratio", "0.25", "--importance", "taylor",
                     "--calibration", text, "--samples", "4", "--seq-len", "16", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["importance"] == "TaylorImportance"
    refused = _invoke(
        str(folder), str(tmp_path / "out2"), "--ratio", "0.25", "--calibration", str(tmp_path / "text.txt")
    )
    assert refused.exit_code == 2 and "--calibration gives --importance taylor its gradient" in refused.output


def test_a_text_for_a_model_that_is_no_language_model_is_refused_before_loading(tmp_path: Path) -> None:
    model, _ = slim_models.hf_vit()
    model.save_pretrained(tmp_path / "vit")
    (tmp_path / "test.txt").write_text("a b c")
    result = _invoke(
        str(tmp_path / "vit"), str(tmp_path / "out"), "--ratio", "0.25", "--eval", str(tmp_path / "test.txt")
    )
    assert result.exit_code == 2 and "--eval is a text for a language model" in result.output


def test_taylor_over_batches_sums_their_gradients() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    first, second = torch.randn(2, 3), torch.randn(5, 3)
    importance = prunereg.get_importance("taylor")(batches=[first, (second,)])
    importance.prepare(model, (torch.randn(1, 3),), {})
    model(first).sum().backward()
    model(second).sum().backward()
    expected = (model[0].weight * model[0].weight.grad).abs().sum(1)
    from prunereg._slim.groups import Group

    group = Group(list(range(4)), {("0.weight", 0): torch.arange(4)}, [None] * 4)
    torch.testing.assert_close(importance(group, {}), expected.detach().double(), rtol=1e-6, atol=0)


def test_the_help_examples_are_the_docs_examples() -> None:
    page = (DOCS / "cli.md").read_text()
    block = page.split("## `prunereg slim`", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    assert block.splitlines() == list(EXAMPLES)
    shown = CliRunner().invoke(main, ["slim", "--help"], terminal_width=200).output
    assert all(example in shown for example in EXAMPLES)


def test_the_docs_list_debug_for_every_command() -> None:
    page = (DOCS / "cli.md").read_text()
    sentence = page.split("## Errors and exit codes", 1)[1].split("has `--debug`", 1)[0]
    for command in ("prune", "report", "oneshot", "shrink", "slim", "list", "info", "plugins", "new-plugin"):
        assert f"`{command}`" in sentence, command
