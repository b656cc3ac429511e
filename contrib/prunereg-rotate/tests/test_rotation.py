"""rotate: the rotated model computes what it did, the sliced one reloads with stock transformers, PCA matters."""

from __future__ import annotations

import copy

import pytest
import torch
from prunereg_rotate import RotationReport, rotate, rotate_by
from rotate_helpers import logits, tiny_llama, token_ids
from torch import nn

import prunereg

transformers = pytest.importorskip("transformers")


class Float64RMSNorm(nn.Module):
    """Llama's RMS norm without its cast to float32, so that a float64 model is float64 throughout."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.variance_epsilon)


def float64_throughout(model: nn.Module) -> nn.Module:
    model = model.double()
    for name, module in list(model.named_modules()):
        if type(module).__name__ == "LlamaRMSNorm":
            parent, _, attribute = name.rpartition(".")
            replacement = Float64RMSNorm(module.weight, module.variance_epsilon)
            setattr(model.get_submodule(parent), attribute, replacement)
    return model


def with_norm_gains(model: nn.Module, seed: int) -> nn.Module:
    """Norm weights away from 1, so that folding them into the readers is tested."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(0.5 + torch.rand(parameter.shape, generator=generator))
    return model


def relative_error(model: nn.Module, reference: nn.Module, ids: torch.Tensor) -> float:
    expected = logits(reference, ids)
    return float((logits(model, ids) - expected).norm() / expected.norm())


@pytest.mark.parametrize("overrides", [{}, {"attention_bias": True, "mlp_bias": True}, {"num_key_value_heads": 4}])
def test_the_rotated_model_computes_the_same_logits_in_float64(overrides: dict) -> None:
    model = float64_throughout(with_norm_gains(tiny_llama(**overrides), seed=5))
    if overrides.get("mlp_bias"):
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() == 1 and parameter.abs().sum() == 0:
                    parameter.normal_(0, 0.1)  # biases of zero would not test their rotation
    reference = copy.deepcopy(model)
    report = rotate(model, token_ids(8, seed=1))
    assert (report.hidden_size_before, report.hidden_size, report.kept_energy) == (32, 32, pytest.approx(1.0))
    assert report.n_tokens == 8 * 16 * 5  # two norms per block and the final one
    held_out = token_ids(4, seed=2)
    difference = (logits(model, held_out) - logits(reference, held_out)).abs().max()
    assert float(difference) < 1e-10
    assert not torch.allclose(model.model.embed_tokens.weight, reference.model.embed_tokens.weight)
    assert all(bool((p == 1).all()) for n, p in model.named_parameters() if n.endswith("norm.weight"))


def test_stock_llama_norms_agree_to_float32_rounding() -> None:
    """LlamaRMSNorm normalizes in float32 even in a float64 model: equal up to its rounding, not 1e-10."""
    model = with_norm_gains(tiny_llama(), seed=5).double()
    reference = copy.deepcopy(model)
    rotate(model, token_ids(8, seed=1))
    assert relative_error(model, reference, token_ids(4, seed=2)) < 1e-6


def low_rank_stream_llama(rank: int, seed: int = 0, leak: float = 0.01, float64: bool = False) -> nn.Module:
    """A tiny Llama whose embedding and writers write mostly into a ``rank``-dim subspace of the residual stream.

    Trained language models concentrate their residual stream in few
    directions (SliceGPT's premise); a randomly initialized one does not, so
    the test builds that structure in: each writer's output is projected onto
    a random subspace, plus ``leak`` times it outside.
    """
    model = with_norm_gains(tiny_llama(seed=seed, initializer_range=0.05), seed=seed)
    if float64:
        model = float64_throughout(model)
    generator = torch.Generator().manual_seed(seed + 100)
    subspace, _ = torch.linalg.qr(torch.randn(32, rank, generator=generator, dtype=model.dtype))
    projector = subspace @ subspace.T
    with torch.no_grad():
        embedding = model.model.embed_tokens.weight
        embedding.copy_(embedding @ projector + leak * embedding)
        for block in model.model.layers:
            for writer in (block.self_attn.o_proj, block.mlp.down_proj):
                writer.weight.copy_(projector @ writer.weight + leak * writer.weight)
    return model


def test_slicing_a_stream_that_lives_in_fewer_dimensions_is_exact_in_float64() -> None:
    """The sliced norms divide by the length the full ones did (eps scaled, sqrt(full / kept) folded in)."""
    reference = low_rank_stream_llama(rank=20, leak=0.0, float64=True)
    sliced = copy.deepcopy(reference)
    report = rotate(sliced, token_ids(8, seed=1), hidden_size=20)
    assert report.kept_energy == pytest.approx(1.0, abs=1e-12)
    held_out = token_ids(4, seed=2)
    assert float((logits(sliced, held_out) - logits(reference, held_out)).abs().max()) < 1e-10


def test_slicing_by_the_principal_directions_loses_little_and_far_less_than_the_first_axes() -> None:
    reference = low_rank_stream_llama(rank=20)
    sliced, first_axes = copy.deepcopy(reference), copy.deepcopy(reference)
    report = rotate(sliced, token_ids(16, seed=1), hidden_size=20)
    rotate_by(first_axes, torch.eye(32)[:, :20])
    held_out = token_ids(8, seed=2)
    errors = {
        "pca": relative_error(sliced, reference, held_out),
        "axes": relative_error(first_axes, reference, held_out),
    }
    assert report.kept_energy > 0.99
    assert errors["pca"] < 0.05, errors
    assert errors["pca"] < errors["axes"] / 10, errors


def test_the_sliced_model_reloads_with_stock_transformers(tmp_path) -> None:
    model = with_norm_gains(tiny_llama(), seed=5)
    rotate(model, token_ids(8, seed=1), hidden_size=20)
    config = model.config
    assert (config.hidden_size, config.head_dim, config.num_attention_heads) == (20, 8, 4)
    assert config.rms_norm_eps == pytest.approx(1e-6 * 32 / 20)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (32, 20)
    assert model.model.layers[0].mlp.down_proj.weight.shape == (20, 48)
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is type(model)
    held_out = token_ids(4, seed=2)
    assert torch.equal(logits(reloaded, held_out), logits(model, held_out))


def test_a_tied_head_gets_its_own_weight_and_reloads(tmp_path) -> None:
    model = with_norm_gains(tiny_llama(tie_word_embeddings=True), seed=5)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    reference = copy.deepcopy(model)
    report = rotate(model, token_ids(8, seed=1), hidden_size=24)
    assert report.untied and "no longer shares" in str(report)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert not model.config.tie_word_embeddings
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    held_out = token_ids(4, seed=2)
    assert torch.equal(logits(reloaded, held_out), logits(model, held_out))
    unsliced = copy.deepcopy(reference)
    rotate(unsliced, token_ids(8, seed=1))
    assert relative_error(unsliced, reference, held_out) < 1e-5


@pytest.mark.parametrize("architecture", ["Mistral", "Qwen2"])
def test_other_llama_style_architectures_rotate_and_reload(architecture: str, tmp_path) -> None:
    config_class = getattr(transformers, f"{architecture}Config")
    model_class = getattr(transformers, f"{architecture}ForCausalLM")
    torch.manual_seed(0)
    config = config_class(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, initializer_range=0.2,
    )  # fmt: skip
    model = with_norm_gains(model_class(config).eval(), seed=5)
    reference = copy.deepcopy(model)
    held_out = token_ids(4, seed=2)
    rotate(model, token_ids(8, seed=1))
    assert relative_error(model, reference, held_out) < 1e-5
    rotate(model, token_ids(8, seed=1), hidden_size=24)
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is model_class and reloaded.config.hidden_size == 24
    assert torch.equal(logits(reloaded, held_out), logits(model, held_out))


def test_the_rotation_is_the_same_from_the_same_calibration() -> None:
    first, second = tiny_llama(), tiny_llama()
    for model in (first, second):
        rotate(model, token_ids(8, seed=1), hidden_size=24)
    for (name, a), (_, b) in zip(first.named_parameters(), second.named_parameters()):
        assert torch.equal(a, b), name


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def unchanged(model: nn.Module, before: dict[str, torch.Tensor], config: dict) -> bool:
    after = model.state_dict()
    same = set(after) == set(before) and all(torch.equal(after[name], before[name]) for name in before)
    return same and model.config.to_dict() == config


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"hidden_size": 0}, ValueError, "between 1 and the model's 32"),
        ({"hidden_size": 33}, ValueError, "between 1 and the model's 32"),
        ({"hidden_size": 16.0}, TypeError, "hidden_size must be an int"),
        ({"calibration": torch.rand(2, 8)}, TypeError, "tensor of token ids"),
        ({"calibration": torch.full((2, 8), 64)}, ValueError, r"outside the vocabulary \[0, 64\)"),
        ({"calibration": torch.zeros(2, 0, dtype=torch.long)}, ValueError, r"\[samples, seq_len\]"),
        ({"batch_size": 0}, ValueError, "batch_size must be an int >= 1"),
    ],
)
def test_bad_arguments_are_refused_before_anything_changes(arguments: dict, error: type, match: str) -> None:
    model = tiny_llama()
    before, config = state(model), model.config.to_dict()
    call = {"calibration": token_ids(2, seed=1), **arguments}
    with pytest.raises(error, match=match):
        rotate(model, call.pop("calibration"), **call)
    assert unchanged(model, before, config)


def test_a_model_without_rms_norms_is_refused() -> None:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    gpt2 = transformers.GPT2LMHeadModel(config).eval()
    with pytest.raises(ValueError, match="Llama-style causal LM"):
        rotate(gpt2, token_ids(2, seed=1))
    model = tiny_llama()
    model.model.layers[1].post_attention_layernorm = nn.LayerNorm(32)
    before, settings = state(model), model.config.to_dict()
    with pytest.raises(ValueError, match=r"model\.layers\.1\.post_attention_layernorm to be an RMS norm"):
        rotate(model, token_ids(2, seed=1))
    assert unchanged(model, before, settings)


def test_a_pruned_model_is_refused() -> None:
    model = tiny_llama()
    prunereg.get("l1_unstructured").apply(model.model.layers[0].mlp.up_proj, "weight", amount=0.5)
    with pytest.raises(ValueError, match="make the model's pruning permanent first"):
        rotate(model, token_ids(2, seed=1))


def test_rotate_by_refuses_a_basis_that_is_not_orthonormal() -> None:
    model = tiny_llama()
    before, config = state(model), model.config.to_dict()
    with pytest.raises(ValueError, match="orthonormal columns"):
        rotate_by(model, 2 * torch.eye(32))
    with pytest.raises(ValueError, match=r"\[32, k\] tensor"):
        rotate_by(model, torch.eye(16))
    assert unchanged(model, before, config)


def test_the_report_reads() -> None:
    report = RotationReport(32, 24, 640, 0.9231, untied=False)
    assert str(report) == (
        "rotated the residual stream by its principal directions on 640 token observations; "
        "hidden size 32 -> 24, 92.31% of the normalized stream kept"
    )
