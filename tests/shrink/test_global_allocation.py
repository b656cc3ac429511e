"""allocation="global": FLAP's adaptive structure, units ranked across blocks, reloaded by prunereg.from_pretrained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

import prunereg  # noqa: E402
from prunereg import ChannelStatistics, ShrinkMethod  # noqa: E402
from prunereg._cli import main  # noqa: E402
from prunereg._models.slimmed import CONFIG_KEY  # noqa: E402
from tests.shrink.models import build, calibration_ids  # noqa: E402
from tests.support.tiny_lm import random_text, save_tiny_llama_folder  # noqa: E402


class _FirstRow(ShrinkMethod):
    """Scores each channel by the output projection's first row, so a test sets the scores through the weights."""

    TARGETS = frozenset({"channels"})
    ALLOCATES_ACROSS_BLOCKS = True

    def channel_scores(self, weight: torch.Tensor, statistics: ChannelStatistics) -> torch.Tensor:
        return weight[0].clone()


def _mlp_widths(model: torch.nn.Module) -> list[int]:
    return [block.mlp.down_proj.weight.shape[1] for block in model.model.layers]


def _reference_keep(scores: list[torch.Tensor], share: float) -> list[int]:
    """A float64 transcription: z-score each block, remove the globally lowest, every block keeping one unit.

    Of equal scores the later unit goes first (the later block's, then the later channel's), as everywhere.
    """
    ranked = []
    for index, block in enumerate(scores):
        block = block.double()
        std = block.std()
        z = (block - block.mean()) / std if std > 0 else torch.zeros_like(block)
        ranked += [(float(value), index, unit) for unit, value in enumerate(z)]
    left = [len(block) for block in scores]
    to_remove = sum(round(share * len(block)) for block in scores)
    for _, index, _ in sorted(ranked, key=lambda entry: (entry[0], -entry[1], -entry[2])):
        if to_remove and left[index] > 1:
            left[index] -= 1
            to_remove -= 1
    return left


def test_the_lowest_standardized_scores_go_across_blocks_and_every_block_keeps_one() -> None:
    model = build("llama")
    width = model.config.intermediate_size
    rows = [
        torch.tensor([-1.0, 1.0] * (width // 2)),  # z = -1 or +1
        torch.ones(width),  # no spread: z = 0, as the next block's, which goes first (the later): all of it but one
        torch.ones(width),
    ]
    with torch.no_grad():
        for block, row in zip(model.model.layers, rows):
            block.mlp.down_proj.weight[0] = row
    report = prunereg.shrink(model, _FirstRow(), mlp=0.5, allocation="global")
    assert _mlp_widths(model) == [width // 2, width - 1, 1] == _reference_keep(rows, 0.5)
    assert [block.kept["mlp"] for block in report.blocks] == [width // 2, width - 1, 1]
    assert report.needs_prunereg_loader and "prunereg.from_pretrained" in str(report)
    assert model.config.intermediate_size == width  # the config cannot state it: the record does
    assert getattr(model.config, CONFIG_KEY)["tensors"]["model.layers.2.mlp.down_proj.weight"] == [32, 1]


def test_flap_global_removes_the_uniform_total_and_reloads_with_prunereg_from_pretrained(tmp_path: Path) -> None:
    model = build("llama").eval()
    ids = calibration_ids()
    report = prunereg.shrink(model, "flap", ids, mlp=0.5, heads=0.5, allocation="global")
    kept = [block.kept["mlp"] for block in report.blocks]
    assert sum(kept) == 3 * 24 and min(kept) >= 1 and len(set(kept)) > 1  # the blocks keep different widths
    assert sum(block.kept["heads"] for block in report.blocks) == 3 and all(
        block.kept["heads"] >= 1 for block in report.blocks
    )
    assert model.config.mlp_bias and model.config.attention_bias  # FLAP's compensation, in every block
    with torch.no_grad():
        expected = model(ids[:2]).logits
    prunereg.save_pretrained(model, tmp_path / "small")
    assert CONFIG_KEY in json.loads((tmp_path / "small" / "config.json").read_text())
    reloaded = prunereg.from_pretrained(LlamaForCausalLM, tmp_path / "small").eval()
    assert _mlp_widths(reloaded) == kept
    with torch.no_grad():
        assert torch.equal(reloaded(ids[:2]).logits, expected)


@pytest.mark.parametrize(
    ("method", "settings", "message"),
    [
        ("wanda_sp", {"mlp": 0.5}, "wanda_sp's scores are not meant to be compared across blocks"),
        ("magnitude_sp", {"heads": 0.5}, "magnitude_sp's scores are not meant to be compared across blocks"),
        ("flap", {"layers": 1}, "spreads the mlp and heads removal over the blocks; give mlp or heads"),
        ("flap", {"mlp": 0.5, "allocation": "adaptive"}, "allocation must be one of 'uniform', 'global'"),
    ],
)
def test_global_allocation_is_refused_in_one_line_and_the_model_is_unchanged(
    method: str, settings: dict[str, object], message: str
) -> None:
    model = build("llama")
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    config = model.config.to_dict()
    with pytest.raises(ValueError, match=message):
        prunereg.shrink(model, method, calibration_ids(), **{"allocation": "global", **settings})
    assert model.config.to_dict() == config
    assert all(torch.equal(tensor, before[name]) for name, tensor in model.state_dict().items())


def test_streaming_refuses_global_allocation_and_writes_nothing(tmp_path: Path) -> None:
    save_tiny_llama_folder(tmp_path / "dense")
    with pytest.raises(ValueError, match="allocation='global' ranks every block's units before cutting any"):
        prunereg.shrink_folder(tmp_path / "dense", tmp_path / "out", "flap", calibration_ids(), mlp=0.5,
                               allocation="global")  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_the_cli_writes_a_folder_prunereg_from_pretrained_loads_and_says_so(tmp_path: Path) -> None:
    save_tiny_llama_folder(tmp_path / "dense")
    (tmp_path / "calibration.txt").write_text(random_text(200, seed=1))
    args = [
        "shrink", str(tmp_path / "dense"), str(tmp_path / "small"), "-m", "flap", "--mlp", "0.5",
        "--allocation", "global", "--calibration", str(tmp_path / "calibration.txt"), "--samples", "4",
        "--seq-len", "32",
    ]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "load the saved model with prunereg.from_pretrained" in result.stdout
    assert CONFIG_KEY in json.loads((tmp_path / "small" / "config.json").read_text())
    model = prunereg.from_pretrained(LlamaForCausalLM, tmp_path / "small")
    assert model(torch.tensor([[1, 2, 3]])).logits.shape[-1] == model.config.vocab_size

    refused = CliRunner().invoke(main, [*args[:2], str(tmp_path / "other"), *args[3:], "--stream"])
    assert refused.exit_code == 2 and "--allocation global ranks every block before cutting any" in refused.stderr
    assert not (tmp_path / "other").exists()


class _RowsAndDepth(_FirstRow):
    TARGETS = frozenset({"channels", "blocks"})
    STATISTICS = frozenset({"block_cosine"})

    def block_score(self, statistics: object) -> float:
        return -float(statistics.cosine_sum)  # type: ignore[attr-defined]


def test_blocks_removed_with_global_widths_reload_renumbered(tmp_path: Path) -> None:
    model = build("llama").eval()
    ids = calibration_ids()
    report = prunereg.shrink(model, _RowsAndDepth(), ids, mlp=0.5, layers=1, allocation="global")
    assert len(model.model.layers) == 2 and len(report.removed_blocks) == 1
    with torch.no_grad():
        expected = model(ids[:2]).logits
    prunereg.save_pretrained(model, tmp_path / "small")
    reloaded = prunereg.from_pretrained(LlamaForCausalLM, tmp_path / "small").eval()
    assert _mlp_widths(reloaded) == _mlp_widths(model)
    with torch.no_grad():
        assert torch.equal(reloaded(ids[:2]).logits, expected)
