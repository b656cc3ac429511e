"""Half precision prunes what float32 prunes; weights that are not finite are refused by the method that spreads them.

The models of :mod:`tests.support.exact_lm` make every calibration activation exact
in float32, float16 and bfloat16, so each dtype must gather the same statistics
bit for bit, choose the same weights and (SparseGPT) compute the same updates in
float32, written back in the model's dtype. Equal scores are broken by position,
the same way in every dtype.
"""

from __future__ import annotations

import copy
import hashlib
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
from prunereg._oneshot.allocation import outlier_ratio
from prunereg._oneshot.contract import LayerStatistics
from prunereg._runtime.standard import Hessian, InputSqNorms
from tests.support.exact_lm import (
    SEEDS,
    TOKEN_COUNTS,
    assert_same_tensors_in_every_dtype,
    calibration_tokens,
    flipping_llama,
    in_every_dtype,
    rich_llama,
)
from tests.support.statistics import folded

pytest.importorskip("transformers")

from tests.support.tiny_lm import calibration_ids, random_text, save_tiny_llama_folder, tiny_llama

SETTINGS = settings(max_examples=10, deadline=None)
HALF = [torch.bfloat16, torch.float16]
NAN_NAME = "model.layers.1.mlp.up_proj.weight"


def _pruned(model: nn.Module, method: str, tokens: torch.Tensor, **options: Any) -> list[nn.Module]:
    """``model`` pruned in each of :data:`EXACT_DTYPES`, float32 first; the reports' allocations alike."""
    pruned, reports = in_every_dtype(
        model,
        lambda typed: prunereg.oneshot(typed, method, calibration=tokens, progress=False, batch_size=16, **options),
    )
    for report in reports[1:]:
        assert report.outlier_ratios == reports[0].outlier_ratios
        assert report.block_sparsities == reports[0].block_sparsities
    return pruned


@SETTINGS
@given(
    seed=SEEDS,
    method=st.sampled_from(["wanda", "sparsegpt", "magnitude"]),
    pattern=st.sampled_from([None, "2:4", "1:4"]),
    sparsity=st.sampled_from([0.25, 0.5, 0.75]),
    n_tokens=TOKEN_COUNTS,
    scale=st.integers(1, 2),
)
def test_every_calibrated_method_prunes_the_same_weights_in_every_dtype(
    seed: int, method: str, pattern: str | None, sparsity: float, n_tokens: int, scale: int
) -> None:
    options = {"pattern": pattern} if pattern else {"sparsity": sparsity}
    pruned = _pruned(rich_llama(seed, scale=scale), method, calibration_tokens(n_tokens, seed), **options)
    assert bool((pruned[0].model.layers[0].mlp.up_proj.weight == 0).any())
    assert_same_tensors_in_every_dtype(pruned)


@SETTINGS
@given(
    seed=SEEDS,
    method=st.sampled_from(["wanda", "sparsegpt", "magnitude"]),
    n_tokens=TOKEN_COUNTS,
    threshold=st.sampled_from([1.5, 2.0, 5.0]),
)
def test_owl_gives_every_block_the_same_sparsity_in_every_dtype(
    seed: int, method: str, n_tokens: int, threshold: float
) -> None:
    options = {"allocation": "owl", "owl_threshold": threshold, "owl_lambda": 0.2}
    pruned = _pruned(flipping_llama(seed, layers=3), method, calibration_tokens(n_tokens, seed), **options)
    assert_same_tensors_in_every_dtype(pruned)


def _representable(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Integers of 4 significant bits up to 480: exact in every dtype, their squares beyond float16's range."""
    generator = torch.Generator().manual_seed(seed)
    ints = torch.randint(-15, 16, shape, generator=generator).float()
    return ints * 2.0 ** torch.randint(0, 6, shape, generator=generator).float()


@pytest.mark.parametrize("dtype", HALF)
def test_running_statistics_of_half_precision_inputs_are_those_of_the_same_float32_values(dtype: torch.dtype) -> None:
    batches = [_representable((n, 3, 8), seed) for seed, n in enumerate((1, 5, 2))]
    for statistic in (InputSqNorms, Hessian):
        half, single = folded(statistic, [batch.to(dtype) for batch in batches]), folded(statistic, batches)
        value = half.result()
        assert value.dtype == torch.float32 and bool(value.isfinite().all())
        assert torch.equal(value, single.result())
    assert folded(Hessian, batches).n_tokens == 24


@pytest.mark.parametrize("dtype", HALF)
def test_owls_outlier_ratio_of_half_precision_weights_is_that_of_the_same_float32_values(dtype: torch.dtype) -> None:
    weights = [_representable((6, 8), 0), _representable((4, 8), 1)]
    statistics = [LayerStatistics(3, input_sq_norms=_representable((8,), seed).abs()) for seed in (2, 3)]
    single = outlier_ratio(weights, statistics, threshold=1.5)
    assert 0 < single < 1
    assert outlier_ratio([w.to(dtype) for w in weights], statistics, threshold=1.5) == single


# -- weights that are not finite -----------------------------------------------------------------------------------


def _with_nan(model: nn.Module, name: str = NAN_NAME, value: float = float("nan")) -> nn.Module:
    with torch.no_grad():
        model.get_parameter(name).view(-1)[5] = value
    return model


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_sparsegpt_names_the_weight_that_is_not_finite_and_leaves_the_model_as_it_was(value: float) -> None:
    model = _with_nan(tiny_llama(layers=2), value=value)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=rf"^{NAN_NAME} is not finite \(it holds NaN or inf\)") as raised:
        prunereg.oneshot(model, "sparsegpt", calibration=calibration_ids(4, 8), progress=False)
    assert "\n" not in str(raised.value) and "dampening" not in str(raised.value)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, before[name], rtol=0, atol=0, equal_nan=True)


def test_sparsegpt_says_the_inputs_of_a_layer_are_not_finite_when_an_unpruned_weight_holds_nan() -> None:
    model = _with_nan(tiny_llama(layers=2), "model.layers.0.post_attention_layernorm.weight", float("nan"))
    inputs = r"^the calibration inputs of model\.layers\.0\.mlp\.gate_proj, .* are not finite"
    with pytest.raises(ValueError, match=inputs):
        prunereg.oneshot(model, "sparsegpt", calibration=calibration_ids(4, 8), progress=False)


def test_a_hessian_that_is_not_finite_is_not_blamed_on_dampening() -> None:
    from prunereg_llm.sparsegpt import upper_cholesky_of_inverse

    hessian = torch.eye(4)
    hessian[1, 2] = hessian[2, 1] = float("nan")
    with pytest.raises(ValueError, match=r"^SparseGPT: the Hessian holds NaN or inf"):
        upper_cholesky_of_inverse(hessian)


def _nan_folder(tmp_path: Path) -> Path:
    save_tiny_llama_folder(tmp_path / "dense")
    from transformers import AutoModelForCausalLM

    _with_nan(AutoModelForCausalLM.from_pretrained(tmp_path / "dense")).save_pretrained(tmp_path / "dense")
    (tmp_path / "calibration.txt").write_text(random_text(200, seed=1))
    return tmp_path / "dense"


@pytest.mark.parametrize("through", ["runner", pytest.param("subprocess", marks=pytest.mark.slow)])
def test_oneshot_stream_with_sparsegpt_names_the_weight_that_is_not_finite_and_writes_nothing(
    tmp_path: Path, through: str
) -> None:
    folder = _nan_folder(tmp_path)
    digests = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in folder.iterdir()}
    args = [
        "oneshot", str(folder), str(tmp_path / "pruned"), "--method", "sparsegpt", "--stream",
        "--calibration", str(tmp_path / "calibration.txt"), "--samples", "4", "--seq-len", "32",
    ]  # fmt: skip
    if through == "runner":
        result = CliRunner().invoke(main, args)
        code, output = result.exit_code, result.output
    else:
        script = Path(sys.executable).with_name("prunereg")
        done = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=300)
        code, output = done.returncode, done.stderr
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert code == 1 and len(errors) == 1, output
    assert errors[0].startswith(f"Error: {NAN_NAME} is not finite") and "dampening" not in output
    assert sorted(path.name for path in tmp_path.iterdir()) == ["calibration.txt", "dense"]
    assert digests == {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in folder.iterdir()}
