"""prunereg.summary: every parameter's sparsity and pruning methods, as data and as the report's table."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import prunereg
from prunereg import Summary, TensorSummary, prune


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))


def test_an_unpruned_model_lists_every_parameter_in_order() -> None:
    net = model()
    with torch.no_grad():
        net[0].bias.zero_()
    found = prunereg.summary(net)
    assert isinstance(found, Summary)
    assert found.rows == (
        TensorSummary("0.weight", (4, 6), "float32", 24, 0),
        TensorSummary("0.bias", (4,), "float32", 4, 4),
        TensorSummary("2.weight", (3, 4), "float32", 12, 0),
        TensorSummary("2.bias", (3,), "float32", 3, 0),
    )
    assert (found.numel, found.zeros, found.sparsity) == (43, 4, 4 / 43)


@pytest.mark.parametrize("library", [prune, torch_prune], ids=["prunereg", "torch"])
def test_pruned_parameters_appear_as_the_forward_sees_them(library: object) -> None:
    net = model()
    library.l1_unstructured(net[0], "weight", amount=0.5)
    library.l1_unstructured(net[0], "weight", amount=0.5)  # a container: 6 more of the 12 left
    library.ln_structured(net[2], "weight", amount=1, n=2, dim=0)
    rows = {row.name: row for row in prunereg.summary(net).rows}
    assert sorted(rows) == ["0.bias", "0.weight", "2.bias", "2.weight"]  # no _orig, no _mask
    assert rows["0.weight"].zeros == int((net[0].weight == 0).sum()) == 18
    assert rows["0.weight"].pruned_by == ("l1_unstructured", "l1_unstructured")
    assert rows["2.weight"].zeros == 4 and rows["2.weight"].pruned_by == ("ln_structured",)
    assert rows["0.bias"].pruned_by == ()


def test_the_values_are_recomputed_not_read_from_a_stale_weight() -> None:
    net = model()
    prune.l1_unstructured(net[0], "weight", amount=0.25)
    with torch.no_grad():
        net[0].weight_orig[0] = 0.0  # as an optimizer step could; net[0].weight is stale until the next forward
    row = prunereg.summary(net).rows[1]
    expected = int(((net[0].weight_orig * net[0].weight_mask) == 0).sum())
    assert row.name == "0.weight" and row.zeros == expected > int((net[0].weight == 0).sum())


def test_compact_bool_masks_are_summarised_too() -> None:
    net = model()
    with prunereg.compact_masks():
        prune.random_unstructured(net[2], "weight", amount=5)
    assert net[2].weight_mask.dtype == torch.bool
    row = prunereg.summary(net).rows[3]
    assert (row.name, row.dtype, row.zeros, row.pruned_by) == ("2.weight", "float32", 5, ("random_unstructured",))


def test_a_shared_parameter_is_listed_once() -> None:
    embedding = nn.Embedding(5, 3)
    head = nn.Linear(3, 5, bias=False)
    head.weight = embedding.weight
    names = [row.name for row in prunereg.summary(nn.ModuleDict({"embed": embedding, "head": head})).rows]
    assert names == ["embed.weight"]


def test_a_registered_method_is_named_as_registered(fresh_registry: None) -> None:
    @prunereg.register("half_of_it", summary="Prune half")
    class HALFMagnitude(prunereg.BasePruningMethod):
        PRUNING_TYPE = "unstructured"

        def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
            return prune.L1Unstructured(amount=0.5).compute_mask(t, default_mask)

    net = model()
    HALFMagnitude.apply(net[0], "weight")
    assert prunereg.summary(net).rows[1].pruned_by == ("half_of_it",)


def test_the_table_is_the_report_table_with_a_column_for_methods() -> None:
    net = model()
    assert str(prunereg.summary(net)).splitlines()[0].split() == [
        "NAME",
        "SHAPE",
        "DTYPE",
        "NUMEL",
        "ZEROS",
        "SPARSITY",
    ]
    prune.l1_unstructured(net[0], "weight", amount=0.5)
    lines = str(prunereg.summary(net)).splitlines()
    assert lines[0].split() == ["NAME", "SHAPE", "DTYPE", "NUMEL", "ZEROS", "SPARSITY", "PRUNED", "BY"]
    assert lines[2].split() == ["0.weight", "4x6", "float32", "24", "12", "50.0%", "[#####.....]", "l1_unstructured"]
    assert lines[-1].split() == ["total", "43", "12", "27.9%", "[###.......]"]
    assert lines[0].index("PRUNED BY") == lines[2].index("l1_unstructured")
    assert all(line == line.rstrip() for line in lines)


def test_rows_as_json_able_dicts() -> None:
    net = model()
    prune.ln_structured(net[0], "weight", amount=0.5, n=1, dim=1)
    found = prunereg.summary(net)
    data = json.loads(json.dumps(found.as_dict()))
    assert data["tensors"] == found.as_dicts()
    assert found.as_dicts()[1] == {
        "name": "0.weight",
        "shape": [4, 6],
        "dtype": "float32",
        "numel": 24,
        "zeros": 12,
        "sparsity": 0.5,
        "pruned_by": ["ln_structured"],
    }
    assert data["total"] == {"numel": 43, "zeros": 12, "sparsity": 12 / 43}


def test_meta_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot count the zeros of 'weight': it is on the meta device"):
        prunereg.summary(nn.Linear(2, 2, device="meta"))


def test_summary_is_public_and_lazy() -> None:
    assert {"summary", "Summary", "TensorSummary"} <= set(prunereg.__all__)
    assert prunereg.summary is __import__("prunereg._models.summary", fromlist=["summary"]).summary


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
    amount=st.floats(0.0, 1.0),
)
def test_zeros_agree_with_torch_for_any_shape_and_dtype(shape: list[int], dtype: torch.dtype, amount: float) -> None:
    generator = torch.Generator().manual_seed(len(shape))
    values = (torch.randperm(int(torch.tensor(shape).prod()), generator=generator) + 1).reshape(shape)
    ours, theirs = nn.Module(), nn.Module()
    ours.w = nn.Parameter(values.to(dtype))
    theirs.w = nn.Parameter(values.to(dtype))
    prune.l1_unstructured(ours, "w", amount=amount)
    torch_prune.l1_unstructured(theirs, "w", amount=amount)
    (row,) = prunereg.summary(ours).rows
    assert row == TensorSummary(
        "w",
        tuple(shape),
        str(dtype).removeprefix("torch."),
        values.numel(),
        int((theirs.w == 0).sum()),
        ("l1_unstructured",),
    )
