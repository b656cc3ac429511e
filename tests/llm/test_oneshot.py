"""prunereg.oneshot: the sequential engine against a hand-written loop, its report, options and errors."""

from __future__ import annotations

import copy

import pytest
import torch

import prunereg
import prunereg.prune as prune

pytest.importorskip("transformers")

from tests.support.tiny_lm import NormScore, calibration_ids, score_prune, tiny_gpt2, tiny_llama, tiny_mistral, tiny_opt


def _reference_llama_loop(model: torch.nn.Module, ids: torch.Tensor, sparsity: float, *, sequential: bool = True):
    """The references' loop written out for Llama: per block, inputs' norms -> prune -> pruned outputs feed on."""
    with torch.no_grad():
        hidden = model.model.embed_tokens(ids)
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        extra = {"position_embeddings": model.model.rotary_emb(hidden, positions), "position_ids": positions}
        for block in model.model.layers:
            inputs: dict[str, torch.Tensor] = {}
            linears = {n: m for n, m in block.named_modules() if isinstance(m, torch.nn.Linear)}
            handles = [
                m.register_forward_pre_hook(lambda m, a, n=n, seen=inputs: seen.setdefault(n, a[0]))
                for n, m in linears.items()
            ]
            dense_output = block(hidden, **extra)
            for handle in handles:
                handle.remove()
            for name, layer in linears.items():
                x = inputs[name].reshape(-1, inputs[name].shape[-1])
                norms = (x**2).sum(0).sqrt()
                layer.weight.copy_(score_prune(layer.weight, layer.weight.abs() * norms, sparsity).weight)
            hidden = block(hidden, **extra) if sequential else dense_output
    return model


def _pruned_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if n.endswith("proj.weight")}


def test_each_block_is_pruned_from_the_outputs_of_the_pruned_blocks_before_it():
    dense, ids = tiny_llama(layers=3), calibration_ids(6, 16)
    expected = _pruned_weights(_reference_llama_loop(copy.deepcopy(dense), ids, 0.5))
    model = copy.deepcopy(dense)
    prunereg.oneshot(model, NormScore(0.5), calibration=ids, batch_size=4, matmul_precision="highest")
    for name, weight in _pruned_weights(model).items():
        assert torch.equal(weight == 0, expected[name] == 0), name
        assert torch.allclose(weight, expected[name]), name
    # The check has teeth: feeding the blocks dense outputs instead selects other weights.
    dense_fed = _pruned_weights(_reference_llama_loop(copy.deepcopy(dense), ids, 0.5, sequential=False))
    assert not torch.equal(
        dense_fed["model.layers.2.mlp.down_proj.weight"] == 0, expected["model.layers.2.mlp.down_proj.weight"] == 0
    )


def test_an_iterable_of_batches_gives_the_same_result_as_one_tensor():
    ids = calibration_ids(6, 16)
    one, batched = tiny_llama(), tiny_llama()
    prunereg.oneshot(one, NormScore(0.5), calibration=ids, batch_size=6, matmul_precision="highest")
    prunereg.oneshot(batched, NormScore(0.5), calibration=[ids[:2], ids[2:5], ids[5]], matmul_precision="highest")
    for (name, a), b in zip(_pruned_weights(one).items(), _pruned_weights(batched).values(), strict=True):
        assert torch.equal(a == 0, b == 0), name


def _backend_precisions() -> tuple[str, str]:
    """torch's float32 matmul precision per backend: (CUDA, oneDNN)."""
    return torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision


class _PrecisionSpy(NormScore):
    """NormScore that notes torch's float32 matmul precision whenever it prunes a group."""

    def __init__(self, sparsity: float) -> None:
        super().__init__(sparsity)
        self.precisions: set[tuple[str, str]] = set()

    def prune_group(self, weights, statistics, sparsities):
        self.precisions.add(_backend_precisions())
        return super().prune_group(weights, statistics, sparsities)


@pytest.fixture
def restore_precision():
    before = _backend_precisions()
    yield
    torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision = before


def test_only_the_calibration_forwards_run_at_the_requested_matmul_precision(restore_precision):
    model, method, seen = tiny_llama(layers=2), _PrecisionSpy(0.5), set()
    model.model.layers[1].register_forward_hook(lambda *_: seen.add(_backend_precisions()))
    # Set through torch's per-backend interface, a mix its legacy getter refuses to read.
    torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision = "tf32", "ieee"
    prunereg.oneshot(model, method, calibration=calibration_ids(2, 8), allocation="owl")
    assert _backend_precisions() == ("tf32", "ieee")  # the caller's setting, restored exactly
    assert seen == {("tf32", "bf16")} and method.precisions == {("ieee", "ieee")}


def test_a_legacy_precision_setting_is_restored_too(restore_precision):
    torch.set_float32_matmul_precision("high")
    prunereg.oneshot(tiny_llama(layers=1), NormScore(0.5), calibration=calibration_ids(2, 8))
    assert torch.get_float32_matmul_precision() == "high"


def test_medium_matmul_precision_prunes_almost_exactly_the_weights_highest_does():
    dense, ids = tiny_llama(layers=3), calibration_ids(6, 16)
    fast, exact = copy.deepcopy(dense), copy.deepcopy(dense)
    prunereg.oneshot(fast, NormScore(0.5), calibration=ids)
    prunereg.oneshot(exact, NormScore(0.5), calibration=ids, matmul_precision="highest")
    fast_masks, exact_masks = _pruned_weights(fast), _pruned_weights(exact)
    agreement = [(fast_masks[n] == 0).eq(exact_masks[n] == 0).float().mean().item() for n in exact_masks]
    assert min(agreement) > 0.97


def test_the_last_block_runs_once_per_batch_its_outputs_feed_nothing():
    model, calls = tiny_llama(layers=2), {0: 0, 1: 0}
    for index, block in enumerate(model.model.layers):
        block.register_forward_pre_hook(lambda *_, index=index: calls.__setitem__(index, calls[index] + 1))
    prunereg.oneshot(model, NormScore(0.5), calibration=calibration_ids(6, 8), batch_size=2)
    assert calls == {0: 9, 1: 3}  # capture, statistics and propagation; statistics only


def test_a_method_without_statistics_runs_no_calibration_forward():
    model, calls = tiny_llama(layers=2), []
    model.model.layers[0].register_forward_pre_hook(lambda *_: calls.append(1))
    expected = copy.deepcopy(model)
    report = prunereg.oneshot(model, "magnitude", calibration=calibration_ids(2, 8), sparsity=0.5)
    assert calls == [] and report.n_tokens == 0 and "without calibration data" in str(report)
    for name, weight in _pruned_weights(model).items():
        dense = expected.get_parameter(name)
        assert torch.equal(weight == 0, score_prune(dense, dense.abs(), 0.5).weight == 0), name
    owl = prunereg.oneshot(tiny_llama(layers=2), "magnitude", calibration=calibration_ids(2, 8), allocation="owl")
    assert owl.outlier_ratios is not None and len(set(owl.block_sparsities)) == 2  # the outlier pass still reads data
    assert owl.n_tokens == 16 and "from 16 calibration tokens" in str(owl)


def test_the_method_gets_float32_weights_of_one_input_group_and_the_statistics_it_needs():
    method = NormScore(0.5)
    model = tiny_llama(layers=1).to(torch.bfloat16)
    prunereg.oneshot(model, method, calibration=calibration_ids(4, 8))
    shapes = [[tuple(w.shape) for w in weights] for weights, _, _ in method.calls]
    assert shapes == [[(32, 32), (16, 32), (16, 32)], [(32, 32)], [(48, 32), (48, 32)], [(32, 48)]]
    for weights, statistics, sparsities in method.calls:
        assert all(w.dtype == torch.float32 for w in weights)
        assert statistics.n_tokens == 32 and statistics.hessian is not None
        assert sparsities == [0.5] * len(weights)
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16


def test_embeddings_and_head_stay_dense_and_the_report_lists_every_pruned_layer():
    model = tiny_llama(layers=2)
    embeddings, head = model.model.embed_tokens.weight.clone(), model.lm_head.weight.clone()
    report = prunereg.oneshot(model, NormScore(0.25), calibration=calibration_ids(4, 8))
    assert torch.equal(model.model.embed_tokens.weight, embeddings) and torch.equal(model.lm_head.weight, head)
    assert [layer.name for layer in report.layers[:3]] == [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    assert len(report.layers) == 14 and report.n_tokens == 32
    for layer in report.layers:
        weight = model.get_parameter(f"{layer.name}.weight")
        assert layer.shape == tuple(weight.shape)
        assert layer.sparsity == pytest.approx((weight == 0).float().mean().item())
        assert layer.target == 0.25 and layer.sparsity == pytest.approx(0.25)
    assert report.block_sparsities == [0.25, 0.25] and report.overall_sparsity == pytest.approx(0.25)
    timings = report.timings
    assert timings.total >= timings.capture + timings.forward + timings.statistics + timings.pruning > 0
    assert report.as_dict()["layers"][0]["name"] == "model.layers.0.self_attn.q_proj"
    assert "14 layers in 2 blocks" in str(report) and "model.layers.1.mlp.down_proj" in report.table()


def test_layers_patterns_restrict_what_is_pruned():
    model = tiny_llama(layers=2)
    report = prunereg.oneshot(model, NormScore(0.5), calibration=calibration_ids(4, 8), layers=["*.mlp.*"])
    assert {layer.name.split(".", 3)[3] for layer in report.layers} == {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
    assert not (model.model.layers[0].self_attn.q_proj.weight == 0).any()


def test_gpt2_conv1d_rows_are_pruned_in_linear_layout():
    model = tiny_gpt2()
    prunereg.oneshot(model, NormScore(0.5), calibration=calibration_ids(4, 8))
    c_fc = model.transformer.h[1].mlp.c_fc.weight  # Conv1D: [in=32, out=128]
    assert (c_fc == 0).sum(dim=0).tolist() == [16] * 128


@pytest.mark.parametrize(("build", "n_layers"), [(tiny_opt, 12), (tiny_mistral, 14)])
def test_opt_and_mistral_are_pruned_block_by_block(build, n_layers):
    report = prunereg.oneshot(build(), NormScore(0.5), calibration=calibration_ids(4, 8))
    assert len(report.layers) == n_layers and report.overall_sparsity == pytest.approx(0.5)


def test_not_permanent_leaves_prunereg_reparametrization_that_remove_makes_permanent():
    permanent, reparametrized = tiny_llama(), tiny_llama()
    ids = calibration_ids(4, 8)
    prunereg.oneshot(permanent, NormScore(0.5), calibration=ids)
    report = prunereg.oneshot(reparametrized, NormScore(0.5), calibration=ids, permanent=False)
    assert not report.permanent and prunereg.is_pruned(reparametrized) and not prunereg.is_pruned(permanent)
    q_proj = reparametrized.model.layers[0].self_attn.q_proj
    assert torch.equal(q_proj.weight_mask != 0, permanent.model.layers[0].self_attn.q_proj.weight != 0)
    for module in list(reparametrized.modules()):
        if hasattr(module, "weight_mask"):
            prunereg.remove(module, "weight")
    for (name, a), b in zip(permanent.named_parameters(), reparametrized.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_train_mode_is_restored():
    model = tiny_llama().train()
    model.model.layers[1].eval()
    prunereg.oneshot(model, NormScore(0.5), calibration=calibration_ids(2, 8))
    assert model.training and model.model.layers[0].training and not model.model.layers[1].training


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"allocation": "random"}, ValueError, "allocation must be one of"),
        ({"allocation": "owl", "method": NormScore(0.5, pattern="2:4")}, ValueError, "N:M pattern fixes"),
        ({"method": "l1_unstructured"}, TypeError, "needs a calibrated one"),
        ({"method": 3}, TypeError, "registered name or a CalibratedMethod"),
        ({"calibration": torch.rand(2, 8)}, TypeError, "integer tensor"),
        ({"calibration": torch.zeros(2, 2, 2, dtype=torch.long)}, ValueError, r"\[n_samples, seq_len\]"),
        ({"calibration": []}, ValueError, "holds no token ids"),
        ({"blocks": "model.nowhere"}, ValueError, "does not name"),
        ({"layers": ["*.nothing"]}, ValueError, "match no Linear layer"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"matmul_precision": "low"}, ValueError, "matmul_precision must be one of"),
        ({"matmul_precision": None}, TypeError, "matmul_precision must be a string"),
        ({"sparsity": 0.3}, ValueError, "come from the instance"),
        ({"method": NormScore(0.6, pattern="3:5")}, ValueError, "divisible by 5"),
    ],
)
def test_bad_arguments_raise_before_anything_changes(kwargs, error, match):
    model = tiny_llama(layers=1)
    before = copy.deepcopy(model.state_dict())
    arguments = {"method": NormScore(0.5), "calibration": calibration_ids(2, 8), **kwargs}
    with pytest.raises(error, match=match):
        prunereg.oneshot(model, arguments.pop("method"), **arguments)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_already_reparametrized_model_is_refused():
    model = tiny_llama(layers=1)
    prune.l1_unstructured(model.model.layers[0].mlp.up_proj, "weight", amount=0.1)
    with pytest.raises(ValueError, match="already pruned"):
        prunereg.oneshot(model, NormScore(0.5), calibration=calibration_ids(2, 8))


class _Tower(torch.nn.Module):
    """A model of no known architecture: embedding, a ModuleList of residual MLP blocks, head."""

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.relu(self.up(x)))

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = torch.nn.Embedding(64, 8), torch.nn.Linear(8, 64)
        self.stack = torch.nn.ModuleList([self.Block() for _ in range(2)])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.stack:
            x = block(x)
        return self.head(x)


def test_any_model_prunes_once_its_blocks_are_named():
    model = _Tower()
    report = prunereg.oneshot(model, NormScore(0.5), calibration=calibration_ids(2, 8), blocks="stack")
    assert [layer.name for layer in report.layers] == ["stack.0.up", "stack.0.down", "stack.1.up", "stack.1.down"]
    assert not (model.head.weight == 0).any()


def test_a_layer_no_calibration_input_reaches_stays_dense_with_a_warning():
    model = _Tower()
    for block in model.stack:
        block.unused = torch.nn.Linear(8, 8)  # an expert no token was routed to, say
    with pytest.warns(RuntimeWarning) as caught:
        report = prunereg.oneshot(model, NormScore(0.5), calibration=calibration_ids(2, 8), blocks="stack")
    assert [str(w.message) for w in caught] == [
        f"no calibration input reached stack.{i}.unused; left dense" for i in (0, 1)
    ]
    assert report.unpruned == ["stack.0.unused", "stack.1.unused"]
    assert len(report.layers) == 4 and not (model.stack[0].unused.weight == 0).any()
