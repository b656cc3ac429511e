"""Slimming's two captures: one eager forward where it can, torch.export where it must; both plan alike.

The eager capture is the default (it costs a forward, where export costs about
a millisecond of Python per operation and, on its first call in a process, the
import of torch's compiler); a model that reads tensor values, on the meta
device, or whose torch function splits an operation export keeps whole goes
through ``torch.export``. Every graph the one follows, the other must follow
to the same plan: the models of the topology suite and random graphs are
slimmed both ways and compared bit for bit, refusals word for word.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import prunereg
from prunereg._slim.capture import EagerCapture
from prunereg._slim.graph import capture_model, through_export
from tests.slim.helpers import AttentionResidual, DataDependentShape, assert_unchanged, exact_state
from tests.slim.test_random_graphs import IMAGE, _built, graphs
from tests.support import slim_models

BUILDERS = [
    "cascaded_concat", "concat_depthwise_residual_cnn", "conv1d_net", "conv3d_net", "embedding_classifier",
    "gated_chunk_mlp", "group_norm_cnn", "grouped_conv", "layer_norm_mlp", "lenet", "residual_mlp",
    "scaled_features", "single_channel_output", "spatial_concat_split", "split_concat_residual", "split_three_ways",
    "two_inputs_two_outputs", "unflatten_into_transposed_conv", "wide_and_deep", "attention_block",
    "hf_bert", "hf_gemma", "hf_gpt2", "hf_resnet50", "hf_smollm2_llama", "hf_vit",
]  # fmt: skip


def _slimmed(model: nn.Module, inputs: Any, export: bool, **options: Any) -> tuple[dict[str, torch.Tensor], str]:
    """A copy of ``model`` slimmed through one capture: its state, and its report's notes or its refusal."""
    model = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if export:
                with through_export():
                    report = prunereg.slim(model, inputs, **options)
            else:
                report = prunereg.slim(model, inputs, **options)
        except prunereg.SlimError as refusal:
            return {}, f"refused: {refusal}"
    return model.state_dict(), f"{report.removed} removed; {report.notes}"


def _assert_alike(model: nn.Module, inputs: Any, **options: Any) -> str:
    eager, exported = _slimmed(model, inputs, False, **options), _slimmed(model, inputs, True, **options)
    assert eager[1] == exported[1]
    assert eager[0].keys() == exported[0].keys()
    for key, tensor in eager[0].items():
        assert tensor.shape == exported[0][key].shape, key
        assert torch.equal(tensor, exported[0][key]), key
    return eager[1]


@pytest.mark.parametrize("builder", BUILDERS)
def test_every_topology_slims_to_the_same_bits_through_either_capture(builder: str) -> None:
    model, inputs = getattr(slim_models, builder)(0)
    eager = builder != "attention_block"  # nn.MultiheadAttention goes through torch.export (see below)
    assert isinstance(capture_model(model, inputs, {}), EagerCapture) is eager
    assert "removed" in _assert_alike(model, inputs, ratio=0.5)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(graphs, st.data())
def test_a_random_graph_with_random_masks_or_a_ratio_plans_alike_through_either_capture(
    blocks: list[tuple[str, int]], data: st.DataObject
) -> None:
    model = _built(blocks)
    if data.draw(st.booleans(), label="masked"):
        layers = [module for module in model.modules() if isinstance(module, (nn.Conv2d, nn.Linear))]
        layer = data.draw(st.sampled_from(layers), label="layer")
        rows = layer.weight.shape[0]
        pruned = data.draw(st.sets(st.integers(0, rows - 1), min_size=1, max_size=rows), label="rows")
        mask = torch.ones_like(layer.weight)
        mask[sorted(pruned)] = 0
        prunereg.get("custom_from_mask").apply(layer, "weight", mask=mask)
        _assert_alike(model, IMAGE)
    else:
        _assert_alike(model, IMAGE, ratio=data.draw(st.sampled_from([0.25, 0.5, 0.75]), label="ratio"))


class ReadsAValue(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 8), nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.a(x) if x.sum() > 0 else self.b(x))  # followed one way only by an eager run


@pytest.mark.parametrize(
    ("build", "inputs"),
    [
        (DataDependentShape, (torch.randn(2, 4),)),
        (AttentionResidual, (torch.randn(2, 5, 6),)),
    ],
    ids=["a boolean index", "a Python torch function splitting linear"],
)
def test_code_an_eager_run_would_follow_one_way_or_split_goes_through_torch_export(
    build: Callable[[], nn.Module], inputs: tuple[torch.Tensor, ...]
) -> None:
    model = build().eval()
    before = exact_state(model)
    assert isinstance(capture_model(model, inputs, {}), torch.export.ExportedProgram)
    assert_unchanged(model, before)


def test_a_branch_on_a_value_is_refused_as_export_refuses_it_and_the_model_is_left_as_it_was() -> None:
    model = ReadsAValue()
    before = exact_state(model)
    with pytest.raises(prunereg.SlimError, match=r"^cannot build the graph of ReadsAValue with torch\.export"):
        prunereg.slim(model, torch.ones(2, 4), ratio=0.5)
    assert_unchanged(model, before)


class BranchOfOneLayer(nn.Module):
    """A branch on values whose every layer runs either way (as transformers' masks check ``.all()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.head = nn.Linear(4, 8, bias=False), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(x))
        return self.head(h if bool((x > 0).all()) else 2 * h)


def test_a_branch_on_values_whose_every_layer_ran_is_captured_eagerly_and_both_branches_stay_exact() -> None:
    model, positive, mixed = BranchOfOneLayer().eval(), torch.rand(3, 4) + 0.1, torch.randn(3, 4)
    assert isinstance(capture_model(model, (positive,), {}), EagerCapture)
    prunereg.get("ln_structured").apply(model.fc, "weight", amount=0.5, n=2, dim=0)
    masked = [model(inputs) for inputs in (positive, mixed)]
    prunereg.slim(model, positive)
    assert model.fc.out_features == 4 and model.head.in_features == 4
    for inputs, expected in zip((positive, mixed), masked, strict=True):  # the branch not taken, too
        torch.testing.assert_close(model(inputs), expected)


def test_a_model_that_fails_on_its_inputs_is_one_line_naming_the_run_and_left_as_it_was() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    before = exact_state(model)
    with pytest.raises(prunereg.SlimError, match=r"^cannot run Sequential on the example inputs: RuntimeError: mat1"):
        prunereg.slim(model, torch.randn(2, 5), ratio=0.5)
    assert_unchanged(model, before)


def test_a_pruned_layers_cached_product_is_captured_as_the_product_of_its_tensors() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    prunereg.get("l1_unstructured").apply(model[0], "weight", amount=0.25)
    with torch.no_grad():
        model(torch.randn(1, 4))  # the pruning hook now holds the product and skips it in no_grad forwards
    captured = capture_model(model, (torch.randn(2, 4),), {})
    assert isinstance(captured, EagerCapture)
    kinds = {spec.kind.name for spec in captured.graph_signature.input_specs}
    assert "CONSTANT_TENSOR" not in kinds  # it would have been read as a constant weight
    products = [node for node in captured.graph.nodes if node.op == "call_function" and "mul" in str(node.target)]
    assert [node.meta["nn_module_stack"]["L__0"][0] for node in products] == ["0"]


def test_a_model_of_a_few_layers_slims_in_a_fresh_process_without_importing_torchs_compiler() -> None:
    code = textwrap.dedent(
        """
        import sys, time
        import torch
        from torch import nn
        import prunereg
        model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 8, 1)).eval()
        start = time.process_time()
        report = prunereg.slim(model, torch.randn(1, 3, 8, 8), ratio=0.5)
        assert report.removed > 0, report
        assert "torch._dynamo" not in sys.modules, "torch.export was used"
        print(time.process_time() - start)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_an_eager_capture_leaves_the_users_random_state_and_grad_mode_alone() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.ReLU(), nn.Linear(8, 2))  # in training mode
    x = torch.randn(2, 4)
    state = torch.get_rng_state()
    prunereg.slim(model, x, ratio=0.5)
    assert torch.equal(torch.get_rng_state(), state) and model.training and torch.is_grad_enabled()


class Tied(nn.Module):
    """Tied input and output embeddings (one tensor under two names), with or without a branch on values."""

    def __init__(self, branch: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.hidden, self.out = nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 10, bias=False)
        self.out.weight = self.embed.weight
        self.branch = branch

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.hidden(self.embed(ids)))
        return self.out(h * 2 if self.branch and not bool((ids >= 0).all()) else h)


def test_a_tied_parameter_under_two_names_counts_as_used_and_is_captured_as_export_captures_it() -> None:
    ids = torch.tensor([[1, 2, 3]])
    plain, branching = Tied(branch=False).eval(), Tied(branch=True).eval()
    captured = capture_model(branching, (ids,), {})  # reads a value, but every parameter took part
    assert isinstance(captured, EagerCapture)
    targets = [spec.target for spec in captured.graph_signature.input_specs if spec.kind.name == "PARAMETER"]
    assert targets == [name for name, _ in branching.named_parameters(remove_duplicate=False)]
    expected = _assert_alike(plain, (ids,), ratio=0.5)  # export follows the model without the branch alike
    state, notes = _slimmed(branching, (ids,), False, ratio=0.5)
    assert notes == expected and all(
        torch.equal(state[key], value) for key, value in _slimmed(plain, (ids,), False, ratio=0.5)[0].items()
    )


class SharedDepthwise(nn.Module):
    """One depthwise convolution shared by two blocks and held by the model too (CoaT shares its position encoding)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.shared = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.blocks = nn.ModuleList(nn.ModuleDict({"conv": nn.Conv2d(8, 8, 1), "pos": self.shared}) for _ in range(2))
        self.stem, self.head = nn.Conv2d(3, 8, 1), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = x + block["pos"](torch.relu(block["conv"](x)))
        return self.head(x.mean((2, 3)))


def test_a_depthwise_convolution_shared_by_several_blocks_slims_alike_through_either_capture() -> None:
    model, x = SharedDepthwise().eval(), torch.randn(1, 3, 6, 6)
    assert isinstance(capture_model(model, (x,), {}), EagerCapture)
    assert "removed" in _assert_alike(model, (x,), ratio=0.5)  # its groups follow its channels under any name


def test_grouped_kv_heads_repeated_by_expand_and_reshape_slim_alike_through_either_capture() -> None:
    pytest.importorskip("transformers")
    from tests.support.tiny_lm import tiny_llama

    # eager attention: the KV heads are repeated by expand then reshape, which torch splits into a copy and a view
    model = tiny_llama(num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager").eval()
    ids = torch.randint(32, (1, 8), generator=torch.Generator().manual_seed(0))
    assert isinstance(capture_model(model, (ids,), {"use_cache": False}), EagerCapture)
    assert "removed" in _assert_alike(model, (ids,), ratio=0.5)


class _Classifier(nn.Module):
    """Convolutions then a classifier over their channels, flattened the way ``how`` says."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU())
        self.pool, self.flatten, self.head = nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.body(x))
        flat = {
            "torch.flatten": lambda: torch.flatten(x, 1),
            "Tensor.flatten": lambda: x.flatten(1),
            "nn.Flatten": lambda: self.flatten(x),
            "view(-1)": lambda: x.view(x.size(0), -1),
        }[self.how]()
        return self.head(flat)


@pytest.mark.parametrize("how", ["torch.flatten", "Tensor.flatten", "nn.Flatten", "view(-1)"])
def test_a_slimmed_model_is_not_captured_again_for_a_view_sized_by_its_input(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prunereg._slim import attempt

    captured_again: list[str] = []

    def counted(*arguments: Any) -> Any:
        captured_again.append(how)
        return capture_like(*arguments)

    capture_like = attempt.capture_like
    monkeypatch.setattr(attempt, "capture_like", counted)
    torch.manual_seed(0)
    model, inputs = _Classifier(how).eval(), (torch.randn(2, 3, 9, 9),)
    slimmed = copy.deepcopy(model)
    prunereg.slim(slimmed, inputs, ratio=0.5)
    assert captured_again == []  # the flattened width follows the plan as the pooled channels do
    assert slimmed.head.in_features == 4 and slimmed(*inputs).shape == (2, 4)
    assert _assert_alike(model, inputs, ratio=0.5) == "8 removed; []"
