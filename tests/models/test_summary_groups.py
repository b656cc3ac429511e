"""Grouped summaries: ``prunereg.summary(model, by=...)`` and ``prunereg report --by ...`` (issue 22, item 4).

A 270-row table (SmolLM2-135M: 30 blocks of 9 tensors) needs one row per block or per tensor type.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import prunereg
import prunereg.prune
from prunereg._cli import main
from prunereg._models.grouping import group_name
from tests.support.state_dicts import minilm_like

transformers = pytest.importorskip("transformers")

from tests.support.tiny_lm import tiny_llama  # noqa: E402


@pytest.fixture
def pruned_llama() -> torch.nn.Module:
    model = tiny_llama(layers=3)
    prunereg.prune.l1_unstructured(model.model.layers[0].mlp.up_proj, "weight", amount=0.5)
    prunereg.prune.ln_structured(model.model.layers[2].self_attn.q_proj, "weight", amount=0.25, n=2, dim=0)
    prunereg.prune.l1_unstructured(model.model.layers[2].self_attn.q_proj, "weight", amount=0.1)
    return model


def test_by_block_gives_one_row_per_block_and_the_same_totals(pruned_llama: torch.nn.Module) -> None:
    rows = prunereg.summary(pruned_llama).rows
    grouped = prunereg.summary(pruned_llama, by="block")
    assert isinstance(grouped, prunereg.GroupedSummary) and grouped.by == "block"
    assert [group.name for group in grouped.groups] == [
        "model.embed_tokens",
        "model.layers.0",
        "model.layers.1",
        "model.layers.2",
        "model.norm",
        "lm_head",
    ]
    for group in grouped.groups:
        members = [row for row in rows if row.name == group.name or row.name.startswith(group.name + ".")]
        assert group.tensors == len(members)
        assert (group.numel, group.zeros) == (sum(r.numel for r in members), sum(r.zeros for r in members))
    by_name = {group.name: group for group in grouped.groups}
    assert by_name["model.layers.0"].pruned_by == ("l1_unstructured",)
    assert by_name["model.layers.2"].pruned_by == ("ln_structured", "l1_unstructured")
    assert by_name["model.layers.1"].pruned_by == ()
    assert (grouped.numel, grouped.zeros) == (sum(r.numel for r in rows), sum(r.zeros for r in rows))


def test_by_type_gives_one_row_per_tensor_of_a_block(pruned_llama: torch.nn.Module) -> None:
    grouped = prunereg.summary(pruned_llama, by="type")
    by_name = {group.name: group for group in grouped.groups}
    up = by_name["model.layers.*.mlp.up_proj.weight"]
    assert up.tensors == 3 and up.zeros == pruned_llama.model.layers[0].mlp.up_proj.weight.numel() // 2
    assert by_name["lm_head.weight"].tensors == 1
    assert len(grouped.groups) == 9 + 3  # nine tensors per block, the embedding, the final norm, the head
    table = str(grouped)
    assert table.splitlines()[0].split()[:5] == ["TYPE", "TENSORS", "NUMEL", "ZEROS", "SPARSITY"]
    assert table.splitlines()[-1].startswith("total") and "PRUNED BY" in table.splitlines()[0]


def test_the_summary_object_groups_too(pruned_llama: torch.nn.Module) -> None:
    assert prunereg.summary(pruned_llama).grouped("block") == prunereg.summary(pruned_llama, by="block")
    with pytest.raises(ValueError, match="by must be one of 'block', 'type', not 'layer'"):
        prunereg.summary(pruned_llama, by="layer")


def test_report_by_block_on_a_file_equals_the_summary_of_its_model(tmp_path: Path) -> None:
    model = tiny_llama(layers=3)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[:, :5] = 0
    path = tmp_path / "model.safetensors"
    state = model.state_dict()
    save_file({name: state[name] for name in state}, path)
    for by in ("block", "type"):
        result = CliRunner().invoke(main, ["report", str(path), "--by", by, "--json"])
        assert result.exit_code == 0, result.stderr
        from_file = json.loads(result.stdout)
        from_model = prunereg.summary(model, by=by).as_dict()
        assert from_file["total"] == from_model["total"] and from_file["by"] == by
        key = lambda group: group["name"]  # noqa: E731  # safetensors files order their names themselves
        assert sorted(from_file["groups"], key=key) == sorted(from_model["groups"], key=key)


def test_a_30_layer_encoder_reports_in_a_screenful(tmp_path: Path) -> None:
    path = tmp_path / "encoder.pt"
    torch.save(minilm_like(layers=30), path)
    result = CliRunner().invoke(main, ["report", str(path), "--by", "block"])
    assert result.exit_code == 0, result.stderr
    names = [line.split()[0] for line in result.stdout.splitlines()[1:-1]]
    assert [name for name in names if name.startswith("encoder.")] == [f"encoder.layer.{i}" for i in range(30)]
    assert names[:5] == [  # no layer number: a row per module
        "embeddings",
        "embeddings.word_embeddings",
        "embeddings.position_embeddings",
        "embeddings.token_type_embeddings",
        "embeddings.LayerNorm",
    ]
    assert names[-1] == "pooler.dense" and len(names) == 36  # 36 rows for 6 + 30 * 16 = 486 tensors


names = st.lists(st.sampled_from(["model", "layers", "h", "attn", "q", "weight", "bias", "0", "1", "12"]), min_size=1)


@settings(max_examples=200, deadline=None)
@given(parts=names)
def test_group_names_are_prefixes_or_patterns_of_the_name(parts: list[str]) -> None:
    name = ".".join(parts)
    block, kind = group_name(name, "block"), group_name(name, "type")
    assert name.startswith(block)
    assert kind.count("*") == sum(part.isdigit() for part in parts)
    assert group_name(kind.replace("*", "7"), "type") == kind
    if not any(part.isdigit() for part in parts):
        assert kind == name and block == (name.rpartition(".")[0] or name)
