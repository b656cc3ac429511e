"""ratio=r: every covered operation slims, counts follow Torch-Pruning's pruning_ratio, ignore and round_to hold."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import prunereg
from tests.slim.helpers import AttentionResidual, DataDependentBranch, DataDependentShape, outputs
from tests.support import slim_models


def _parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class Bottleneck(nn.Module):
    """Linear, LayerNorm, residual add: the hidden width is one group, the inner width another."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(5, 8)
        self.norm = nn.LayerNorm(8)
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = h + self.down(torch.relu(self.up(self.norm(h))))
        return self.head(h)


def test_half_of_every_group_goes_and_the_output_keeps_its_shape() -> None:
    torch.manual_seed(0)
    model, x = Bottleneck(), torch.randn(4, 5)
    report = prunereg.slim(model, x, ratio=0.5)
    assert (model.embed.out_features, model.up.out_features) == (4, 8)
    assert model.norm.normalized_shape == (4,) and model.head.weight.shape == (3, 4)
    assert outputs(model, (x,)).shape == (4, 3)
    assert report.groups == 2 and report.removed == 4 + 8
    assert report.params_after == _parameters(model) < report.params_before
    assert report.macs_after < report.macs_before


def test_round_to_keeps_a_multiple_of_it() -> None:
    model, x = Bottleneck(), torch.randn(2, 5)
    prunereg.slim(model, x, ratio=0.5, round_to=3)
    assert model.embed.out_features == 6 and model.up.out_features == 9


def test_an_ignored_module_keeps_every_tensor_whole() -> None:
    model, x = Bottleneck(), torch.randn(2, 5)
    prunereg.slim(model, x, ratio=0.5, ignore=[model.up])
    assert model.up.weight.shape == (16, 8) and model.down.weight.shape == (8, 16)  # the hidden width pinned too
    model = Bottleneck()
    prunereg.slim(model, x, ratio=0.5, ignore=["down"])
    assert model.down.weight.shape == (8, 16)


def test_magnitude_removes_the_channels_of_smallest_group_norm() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    with torch.no_grad():
        model[0].weight.mul_(torch.tensor([5.0, 0.01, 5.0, 0.02, 5.0, 0.03])[:, None])
        model[0].bias.zero_()
        model[2].weight.fill_(0.01)
    prunereg.slim(model, torch.randn(2, 4), ratio=0.5)
    assert model[0].weight.abs().sum(1).min() > 1  # rows 1, 3 and 5 went


@pytest.mark.parametrize(
    "importance", ["random", "taylor", prunereg.get_importance("taylor")(loss=lambda out: out.pow(2).sum())]
)
def test_the_other_built_in_importances_slim_and_leave_gradients_as_they_were(importance: object) -> None:
    model, x = Bottleneck(), torch.randn(3, 5)
    model.up.weight.requires_grad_(False)
    report = prunereg.slim(model, x, ratio=0.5, importance=importance)  # type: ignore[arg-type]
    assert model.up.out_features == 8 and report.removed == 12
    assert all(p.grad is None for p in model.parameters()) and not model.up.weight.requires_grad


class LastFirst(prunereg.Importance):
    """Scores falling along the group: the last units go first."""

    def __call__(self, group, values):  # type: ignore[no-untyped-def]
        return torch.arange(group.size, 0, -1, dtype=torch.float64)


@pytest.mark.usefixtures("fresh_registry")
@pytest.mark.parametrize("how", ["register_importance", "register"])
def test_a_registered_importance_is_used_by_name_and_listed_as_kind_importance(how: str) -> None:
    if how == "register_importance":
        prunereg.register_importance("last_first")(LastFirst)
    else:
        prunereg.register("last_first", kind="importance")(LastFirst)
    assert "last_first" in prunereg.list_methods("importance")
    assert prunereg.get_importance("last_first") is LastFirst
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    kept = model[0].weight.detach()[:3].clone()
    prunereg.slim(model, torch.randn(2, 4), ratio=0.5, importance="last_first")
    torch.testing.assert_close(model[0].weight.detach(), kept)


@pytest.mark.usefixtures("fresh_registry")
def test_a_built_in_importance_name_is_taken_only_with_replace() -> None:
    with pytest.raises(ValueError, match="already registered"):
        prunereg.register_importance("magnitude")(LastFirst)
    prunereg.register_importance("random", replace=True)(LastFirst)
    assert prunereg.get_importance("random") is LastFirst


def test_an_importance_must_subclass_the_contract() -> None:
    with pytest.raises(TypeError, match=r"not a prunereg\.Importance subclass"):
        prunereg.register_importance("plain")(object)


@pytest.mark.parametrize(
    ("ratio", "round_to", "error"),
    [(1.0, 1, ValueError), (-0.1, 1, ValueError), ("half", 1, TypeError), (0.5, 0, ValueError), (0.5, 1.5, TypeError)],
)
def test_bad_arguments_are_refused_with_the_model_unchanged(ratio: object, round_to: object, error: type) -> None:
    model = Bottleneck()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error):
        prunereg.slim(model, torch.randn(2, 5), ratio=ratio, round_to=round_to)  # type: ignore[arg-type]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_unknown_importance_or_ignored_name_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"unknown importance 'nope'.*magnitude"):
        prunereg.slim(Bottleneck(), torch.randn(2, 5), ratio=0.5, importance="nope")
    with pytest.raises(ValueError, match=r"'nope', which is no module"):
        prunereg.slim(Bottleneck(), torch.randn(2, 5), ratio=0.5, ignore=["nope"])


# -- every covered operation, through the peer topologies ------------------------------------------------------
COVERED: dict[str, Callable[[int], slim_models.Built]] = {
    "conv, batch norm, depthwise conv, concat, residual": slim_models.concat_depthwise_residual_cnn,
    "cascaded concat": slim_models.cascaded_concat,
    "split, concat, residual": slim_models.split_concat_residual,
    "split in three": slim_models.split_three_ways,
    "chunk into a gate": slim_models.gated_chunk_mlp,
    "grouped conv": slim_models.grouped_conv,
    "conv1d": slim_models.conv1d_net,
    "conv3d": slim_models.conv3d_net,
    "flatten into a linear": slim_models.lenet,
    "multi-head attention": slim_models.attention_block,
    "layer norm": slim_models.layer_norm_mlp,
    "group norm": slim_models.group_norm_cnn,
    "embedding": slim_models.embedding_classifier,
}


@pytest.mark.parametrize("build", COVERED.values(), ids=COVERED.keys())
def test_each_covered_operation_slims_to_a_smaller_model_with_the_same_output_shapes(
    build: Callable[[int], slim_models.Built],
) -> None:
    model, inputs = build(0)
    shapes = slim_models.output_shapes(model, inputs)
    report = prunereg.slim(model, inputs, ratio=0.5)
    assert slim_models.output_shapes(model, inputs) == shapes
    assert report.params_after == slim_models.parameter_count(model) < report.params_before


def test_a_grouped_conv_loses_whole_groups_and_a_depthwise_conv_its_channels_with_their_inputs() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 8, 1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=4), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2),
    )  # fmt: skip
    x = torch.randn(1, 3, 6, 6)
    prunereg.slim(model, x, ratio=0.5)
    assert (model[2].groups, model[2].in_channels, model[2].out_channels) == (2, 4, 4)
    assert (model[4].groups, model[4].in_channels, model[4].out_channels) == (4, 4, 4)
    assert outputs(model, (x,)).shape == (1, 2)


def test_multihead_attention_loses_whole_heads_with_its_width() -> None:
    model, x = AttentionResidual(), torch.randn(2, 5, 6)
    prunereg.slim(model, x, ratio=0.5)
    attention = model.attention
    assert attention.head_dim == 4 and attention.num_heads == 2 and attention.embed_dim == 8
    assert model.stem.out_features == 8 and outputs(model, (x,)).shape == (2, 5, 3)


def test_multihead_attention_reading_the_model_input_keeps_its_heads() -> None:
    model, inputs = slim_models.attention_block(0)
    prunereg.slim(model, inputs, ratio=0.5)
    assert model.attention.num_heads == 4  # its width is the input's, which keeps its shape
    assert model.mlp[0].out_features == 16


class FixedSplit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = torch.split(self.fc(x), [4, 4], dim=1)  # sizes written in the code
        return self.out(a * b)


@pytest.mark.parametrize("pruned", [False, True], ids=["plain", "pruned, scored by gradients"])
def test_a_module_that_reads_a_fixed_width_fails_after_the_cut_and_is_put_back_exactly(pruned: bool) -> None:
    from tests.slim.helpers import assert_unchanged, exact_state

    model, x = FixedSplit(), torch.randn(2, 4)
    if pruned:  # a pruning hook's tensor, gradients run by taylor: all as it was, too
        prunereg.get("l1_unstructured").apply(model.fc, "weight", amount=0.25)
    before = exact_state(model)
    with pytest.raises(prunereg.SlimError, match=r"the slimmed model fails.*ignore="):
        prunereg.slim(model, x, ratio=0.5, importance="taylor" if pruned else "magnitude")
    assert_unchanged(model, before)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (DataDependentShape(), "aten.index in the model makes a shape that depends on the data"),
        (DataDependentBranch(), "cannot build the graph of DataDependentBranch with torch.export"),
    ],
    ids=["data-dependent shape", "data-dependent branch"],
)
def test_a_model_the_graph_cannot_follow_is_refused_naming_why_and_left_as_it_was(
    model: nn.Module, message: str
) -> None:
    from tests.slim.helpers import assert_unchanged, exact_state

    before = exact_state(model)
    with pytest.raises(prunereg.SlimError, match=message):
        prunereg.slim(model, torch.randn(2, 4), ratio=0.5)
    assert_unchanged(model, before)


def test_an_operation_without_a_rule_pins_what_it_touches_and_says_so_when_masked_channels_need_it() -> None:
    class Cumulative(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 6, bias=False)
            self.out = nn.Linear(6, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(torch.cumsum(self.fc(x), dim=1))

    model, x = Cumulative(), torch.randn(2, 4)
    assert prunereg.slim(model, x, ratio=0.5).removed == 0
    prunereg.get("ln_structured").apply(model.fc, "weight", amount=2, n=2, dim=0)
    with pytest.raises(prunereg.SlimError, match=r"aten.cumsum in the model reads fixed positions"):
        prunereg.slim(model, x)


def test_slimming_leaves_every_module_in_the_mode_it_was_in() -> None:
    model, x = Bottleneck().train(), torch.randn(2, 5)
    model.norm.eval()
    prunereg.slim(model, x, ratio=0.5)
    assert model.training and model.up.training and not model.norm.training


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_model_on_the_gpu_slims_there() -> None:
    model, inputs = slim_models.concat_depthwise_residual_cnn(0)
    model, inputs = model.cuda(), tuple(t.cuda() for t in inputs)
    shapes = slim_models.output_shapes(model, inputs)
    report = prunereg.slim(model, inputs, ratio=0.5, importance="taylor")
    assert slim_models.output_shapes(model, inputs) == shapes and report.params_after < report.params_before
    assert all(p.is_cuda for p in model.parameters())


class FunctionalOps(nn.Module):
    """Pooling, resizing, padding, einsum, a norm over channels, softmax: channels pass through each."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.mix = nn.Parameter(torch.randn(8, 6))
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        h = nn.functional.max_pool2d(h, 2)
        h = nn.functional.interpolate(h, scale_factor=2.0, mode="nearest")
        h = nn.functional.pad(h, (1, 1, 1, 1))
        h = h / torch.linalg.vector_norm(h, 2, dim=1, keepdim=True).clamp_min(1e-6)
        h = torch.softmax(h, dim=1).mean(dim=(2, 3))
        return self.head(torch.einsum("bc,cd->bd", h, self.mix))


def test_pooling_resizing_padding_einsum_and_reductions_let_channels_through() -> None:
    torch.manual_seed(0)
    model, x = FunctionalOps(), torch.randn(2, 3, 8, 8)
    prunereg.slim(model, x, ratio=0.5)
    assert model.conv.out_channels == 4 and model.mix.shape == (4, 6)
    assert outputs(model, (x,)).shape == (2, 2)


class PaddedSequence(nn.Module):
    """Padding the sequence (and the channels by nothing, as Swin does) between two Linears."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 8)
        self.down = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.pad(torch.relu(self.up(x)), (0, 0, 1, 1)))


def test_padding_that_leaves_the_channels_alone_lets_them_through_and_the_padded_dimension_keeps_its_positions() -> (
    None
):
    model, x = PaddedSequence(), torch.randn(2, 5, 4)
    prunereg.slim(model, x, ratio=0.5)
    assert model.up.out_features == 4 and model.down.in_features == 4
    assert outputs(model, (x,)).shape == (2, 7, 2)


class TopK(nn.Module):
    """A router: top-k over a Linear's outputs (as a mixture of experts picks its experts)."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(4, 8)
        self.out = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.topk(self.router(x), 2, dim=-1).values)


def test_top_k_keeps_the_positions_it_ranks() -> None:
    model, x = TopK(), torch.randn(3, 4)
    assert prunereg.slim(model, x, ratio=0.5).removed == 0 and model.router.out_features == 8


def test_the_report_prints_one_row_per_changed_layer_and_gives_every_tensor_as_json() -> None:
    import json

    model, x = Bottleneck(), torch.randn(2, 5)
    report = prunereg.slim(model, x, ratio=0.5)
    text = str(report)
    assert "parameters" in text and "MACs" in text
    rows = [line.split()[0] for line in text.splitlines()[6:]]
    assert rows == ["embed", "norm", "up", "down", "head"]
    data = json.loads(json.dumps(report.as_dict()))
    assert {"name": "norm.bias", "before": [8], "after": [4]} in data["changes"]
    assert data["params_after"] == report.params_after and data["macs_after"] < data["macs_before"]


class DictOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        return {"out": self.b(torch.relu(self.a(x))), "nothing": None, "count": 3}


def test_outputs_holding_none_and_numbers_beside_tensors_slim_too() -> None:
    model = DictOutput()
    assert prunereg.slim(model, torch.randn(2, 4), ratio=0.5).removed == 4 and model.a.out_features == 4
