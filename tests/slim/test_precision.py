"""Half precision slims what float32 slims: every importance is a function of the values, never of object identity.

Values are small integers, which float32, float16 and bfloat16 all hold exactly,
and so are the activations and gradients of :func:`_exact_mlp` (below 256 in every
layer), so each dtype must score every unit bit for bit alike. Equal scores are
broken by position (the later unit goes first), the same way in every dtype.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import prunereg
from prunereg._cli import main
from prunereg._slim.graph import build_graph, capture_model
from prunereg._slim.groups import find_groups
from prunereg._slim.importance import get_importance
from tests.support import slim_models
from tests.support.exact_lm import EXACT_DTYPES, SEEDS, assert_same_tensors_in_every_dtype, in_every_dtype

HALF = [torch.bfloat16, torch.float16]
IMPORTANCES = ["magnitude", "taylor", "random"]


def _issue_model(dtype: torch.dtype) -> nn.Sequential:
    torch.manual_seed(1)
    layers = [nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(16, 4)).to(dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_the_issues_half_precision_mlp_keeps_the_rows_its_group_norms_rank_highest(dtype: torch.dtype) -> None:
    model = _issue_model(dtype)
    rows, bias, reader = (t.detach().float() for t in (model[0].weight, model[0].bias, model[2].weight))
    group_norms = (rows.square().sum(1) + bias.square() + reader.square().sum(0)).sqrt()
    expected = sorted(group_norms.topk(8).indices.tolist())
    assert expected == [3, 7, 8, 9, 10, 11, 13, 14]  # the issue's float32 run keeps these too
    prunereg.slim(model, torch.randn(2, 16).to(dtype), ratio=0.5)
    kept = [int((rows == row.float()).all(dim=1).nonzero()) for row in model[0].weight.detach()]
    assert kept == expected


def _exact_mlp(seed: int) -> tuple[nn.Sequential, torch.Tensor]:
    """Weights, biases and inputs in {-1, 0, 1}: activations stay below 74, gradients below 147, exact in any dtype."""
    generator = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randint(-1, 2, parameter.shape, generator=generator).float())
    return model.eval(), torch.randint(-1, 2, (2, 8), generator=generator).float()


def _slimmed(model: nn.Module, inputs: torch.Tensor, seed: int, **options: Any) -> list[nn.Module]:
    def run(typed: nn.Module) -> None:
        torch.manual_seed(seed)  # the random importance's draws
        prunereg.slim(typed, inputs.to(next(typed.parameters()).dtype), **options)

    return in_every_dtype(model, run)[0]


@settings(max_examples=25, deadline=None)
@given(
    seed=SEEDS,
    importance=st.sampled_from(IMPORTANCES),
    ratio=st.sampled_from([0.25, 0.5, 0.75]),
    round_to=st.sampled_from([1, 2]),
)
def test_every_builtin_importance_slims_the_same_units_in_bfloat16_float16_and_float32(
    seed: int, importance: str, ratio: float, round_to: int
) -> None:
    model, inputs = _exact_mlp(seed)
    slimmed = _slimmed(model, inputs, seed, ratio=ratio, importance=importance, round_to=round_to)
    assert slimmed[0][0].out_features < 8
    assert_same_tensors_in_every_dtype(slimmed)


@pytest.mark.parametrize("importance", IMPORTANCES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_importance_scores_half_precision_values_as_it_scores_float32_ones(importance: str, seed: int) -> None:
    model, inputs = _exact_mlp(seed)
    graph = build_graph(model, capture_model(model, (inputs,), {}))
    groups = find_groups(graph)
    scores = {}
    for dtype in EXACT_DTYPES:
        typed = copy.deepcopy(model).to(dtype)
        values = {name: parameter.detach() for name, parameter in typed.named_parameters()}
        scorer = get_importance(importance)()
        torch.manual_seed(seed)
        scorer.prepare(typed, (inputs.to(dtype),), {})
        scores[dtype] = [scorer(group, values) for group in groups]
    assert len(groups) == 2
    for dtype in HALF:
        for half, single in zip(scores[dtype], scores[torch.float32], strict=True):
            assert half.dtype == torch.float64 and torch.equal(half, single)


def test_one_magnitude_importance_scores_new_values_held_under_the_same_names() -> None:
    model, inputs = _exact_mlp(0)
    groups = find_groups(build_graph(model, capture_model(model, (inputs,), {})))
    scorer = get_importance("magnitude")()
    for scale in (1.0, 2.0, 4.0):
        values = {name: (parameter.detach() * scale).bfloat16() for name, parameter in model.named_parameters()}
        fresh = get_importance("magnitude")()
        for group in groups:
            assert torch.equal(scorer(group, values), fresh(group, values))


@pytest.mark.parametrize("dtype", HALF)
def test_taylor_multiplies_half_precision_weights_by_their_gradients_in_float32(dtype: torch.dtype) -> None:
    """Weights, activations and gradients need at most 8 bits (exact in every dtype); their products up to 14.

    The gradient of the one output's sum: ``dL/dW1[i, j] = W2[0, i]`` (inputs are ones), ``dL/dW2[0, i] = (W1 1)_i``.
    """
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.ReLU(), nn.Linear(4, 1, bias=False)).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # odd integers up to 63: the first layer's outputs positive, below 253
            parameter.copy_(2 * torch.randint(0, 32, parameter.shape, generator=generator).float() + 1)
    inputs = torch.ones(1, 4)
    graph = build_graph(model, capture_model(model, (inputs,), {}))
    [group] = find_groups(graph)
    scores = []
    for typed in (model, copy.deepcopy(model).to(dtype)):
        scorer = get_importance("taylor")()
        scorer.prepare(typed, (inputs.to(typed[0].weight.dtype),), {})
        scores.append(scorer(group, {}))
    first, second = model[0].weight.detach(), model[2].weight.detach()
    # |w x dL/dw| over each unit's row of the first layer and column of the second (all positive, exact)
    products = (first * second.sum(0)[:, None]).sum(1) + (second * first.sum(1)).sum(0)
    assert torch.equal(scores[0], products.double())
    assert torch.equal(scores[1], scores[0])


def _cli_folders(tmp_path: Path) -> tuple[Path, Path]:
    """The tiny SmolLM2-shaped Llama as a bfloat16 folder, and the same values as a float32 folder."""
    model, _ = slim_models.hf_smollm2_llama()
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    model.float().save_pretrained(tmp_path / "fp32")
    return tmp_path / "bf16", tmp_path / "fp32"


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {name: t for file in sorted(folder.glob("*.safetensors")) for name, t in load_file(file).items()}


@pytest.mark.parametrize("through", ["runner", pytest.param("subprocess", marks=pytest.mark.slow)])
def test_prunereg_slim_on_a_bfloat16_folder_writes_what_the_float32_folder_of_its_values_gives(
    tmp_path: Path, through: str
) -> None:
    pytest.importorskip("transformers")
    bf16, fp32 = _cli_folders(tmp_path)
    ratio = ["--ratio", "0.5"]
    single = CliRunner().invoke(main, ["slim", str(fp32), str(tmp_path / "fp32-out"), *ratio])
    assert single.exit_code == 0, single.output
    args = ["slim", str(bf16), str(tmp_path / "bf16-out"), *ratio]
    if through == "runner":
        half = CliRunner().invoke(main, args)
        assert half.exit_code == 0, half.output
    else:
        script = Path(sys.executable).with_name("prunereg")
        done = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    half_weights, single_weights = _weights(tmp_path / "bf16-out"), _weights(tmp_path / "fp32-out")
    assert half_weights.keys() == single_weights.keys()
    for name, tensor in half_weights.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, single_weights[name].to(torch.bfloat16)), name
    assert half_weights["model.layers.0.mlp.gate_proj.weight"].shape[0] < 64
