"""prunereg.shrink: every dimension on every architecture reloads with stock transformers; refusals change nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import prunereg  # noqa: E402
from prunereg import ShrinkMethod  # noqa: E402
from tests.shrink.models import build, calibration_ids  # noqa: E402

CASES = [
    *[(arch, "wanda_sp", {"mlp": 0.5}) for arch in ("llama", "qwen2", "mistral", "phi3", "gpt2")],
    *[(arch, "wanda_sp", {"heads": 0.5}) for arch in ("llama", "qwen2", "mistral", "phi3", "mixtral")],
    ("llama", "flap", {"mlp": 0.25, "heads": 0.5}),
    ("gpt2", "flap", {"mlp": 0.5}),
    ("opt", "flap", {"mlp": 0.5}),
    ("opt", "block_influence", {"layers": 1}),
    ("qwen2", "flap", {"mlp": 0.5, "compensate": False}),
    ("llama", "magnitude_sp", {"mlp": 0.5, "heads": 0.5}),
    *[(arch, "block_influence", {"layers": 1}) for arch in ("llama", "qwen2", "mistral", "phi3", "gpt2", "mixtral")],
    ("qwen2_moe", "block_influence", {"layers": 1}),
    ("mixtral", "reap", {"experts": 0.5}),
    ("qwen2_moe", "reap", {"experts": 0.5}),
]


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def _state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return {k: v.clone() for k, v in model.state_dict().items()}, model.config.to_dict()


def _assert_unchanged(model: nn.Module, before: tuple[dict[str, torch.Tensor], dict[str, Any]]) -> None:
    state, config = before
    after = model.state_dict()
    assert after.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(after[name], tensor), name
    assert model.config.to_dict() == config


@pytest.mark.parametrize(("architecture", "method", "options"), CASES, ids=lambda v: str(v))
def test_a_shrunk_model_reloads_with_stock_transformers_and_gives_the_same_logits(
    architecture: str, method: str, options: dict[str, Any], tmp_path: Any
) -> None:
    model = build(architecture)
    report = prunereg.shrink(model, method, calibration_ids(), matmul_precision="highest", **options)
    assert report.params_after < report.params_before
    assert report.params_after == sum(p.numel() for p in model.parameters())
    ids = calibration_ids(2, 12, seed=7)
    expected = _logits(model, ids)
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(_logits(reloaded, ids), expected, rtol=0, atol=0)
    assert sum(p.numel() for p in reloaded.parameters()) == report.params_after


def test_the_config_states_the_new_width_of_every_block() -> None:
    model = build("llama")
    report = prunereg.shrink(model, "wanda_sp", calibration_ids(), mlp=0.25, heads=0.5)
    config = model.config
    assert (config.intermediate_size, config.num_attention_heads, config.num_key_value_heads) == (36, 2, 1)
    assert config.head_dim == 8
    for layer in model.model.layers:
        assert layer.mlp.gate_proj.weight.shape == (36, 32)
        assert layer.mlp.down_proj.in_features == 36
        assert layer.self_attn.q_proj.out_features == 16
        assert layer.self_attn.k_proj.out_features == 8
    assert report.config["intermediate_size"] == [48, 36]
    assert [block.kept for block in report.blocks] == [{"mlp": 36, "heads": 1}] * 3


def test_flap_adds_the_mean_of_removed_channels_to_the_new_down_projection_bias() -> None:
    model = build("llama")
    prunereg.shrink(model, "flap", calibration_ids(), mlp=0.5)
    assert model.config.mlp_bias is True
    mlp = model.model.layers[0].mlp
    assert mlp.down_proj.bias is not None and bool(mlp.down_proj.bias.abs().sum() > 0)
    assert mlp.gate_proj.bias is not None and not bool(mlp.gate_proj.bias.any())  # the bias mlp_bias=True creates


def test_a_model_without_some_blocks_still_generates_with_its_cache() -> None:
    model = build("llama")
    report = prunereg.shrink(model, "block_influence", calibration_ids(), layers=2)
    assert len(report.removed_blocks) == 2 and model.config.num_hidden_layers == 1
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == [0]
    out = model.generate(calibration_ids(1, 5), max_new_tokens=3, do_sample=False, use_cache=True)
    assert out.shape == (1, 8)


def test_block_influence_removes_the_blocks_that_change_their_input_least() -> None:
    model = build("llama")
    report = prunereg.shrink(model, "block_influence", calibration_ids(), layers=1)
    scores = [block.score for block in report.blocks]
    assert report.removed_blocks == [scores.index(min(scores))]


def test_magnitude_sp_needs_no_calibration_data() -> None:
    model = build("llama")
    report = prunereg.shrink(model, "magnitude_sp", mlp=0.5)
    assert report.n_tokens == 0 and model.config.intermediate_size == 24


def test_the_report_prints_a_table_and_turns_into_json() -> None:
    model = build("llama")
    report = prunereg.shrink(model, "wanda_sp", calibration_ids(), mlp=0.5)
    text = str(report)
    assert "MLP CHANNELS" in text and "model.layers.2  24/48" in text
    data = json.loads(report.to_json())
    assert data["params_after"] == report.params_after and data["blocks"][0]["kept"] == {"mlp": 24}


REFUSALS = [
    ("llama", "wanda_sp", {"mlp": 0.99}, ValueError, "would leave no channel"),
    ("llama", "wanda_sp", {"heads": 0.9}, ValueError, "would leave no key/value group"),
    ("gpt2", "wanda_sp", {"heads": 0.5}, ValueError, "no config can state fewer heads"),
    ("opt", "wanda_sp", {"heads": 0.5}, ValueError, "no config can state fewer heads"),
    ("qwen2", "flap", {"mlp": 0.5}, ValueError, "has no 'mlp_bias'"),
    ("opt-without-biases", "flap", {"mlp": 0.5}, ValueError, "OPTConfig has no 'mlp_bias'"),
    ("llama", "reap", {"experts": 0.5}, ValueError, "needs a mixture-of-experts model"),
    ("mixtral", "reap", {"experts": 0.75}, ValueError, "fewer than the 2 each token is routed to"),
    ("mixtral", "wanda_sp", {"mlp": 0.5}, ValueError, "mixture of experts"),
    ("llama", "block_influence", {"layers": 3}, ValueError, "would leave none of the 3 blocks"),
    ("llama", "block_influence", {"mlp": 0.5}, ValueError, "needs a method that scores channels"),
    ("llama", "flap", {}, ValueError, "nothing to remove"),
    ("llama", "wanda_sp", {"mlp": 1.5}, ValueError, "must be in [0, 1)"),
    ("llama", "wanda_sp", {"layers": -1}, ValueError, "layers must be a number of blocks"),
    ("llama", "wanda", {"mlp": 0.5}, TypeError, "shrink needs one of kind shrink"),
    ("llama", "flap", {"mlp": 0.5, "compensate": "yes"}, TypeError, "compensate must be True or False"),
]


@pytest.mark.parametrize(("architecture", "method", "options", "error", "message"), REFUSALS, ids=lambda v: str(v))
def test_a_request_the_model_or_config_cannot_express_is_refused_with_one_line_and_changes_nothing(
    architecture: str, method: str, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    model = build(architecture)
    before = _state(model)
    with pytest.raises(error) as caught:
        prunereg.shrink(model, method, calibration_ids(), **options)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    _assert_unchanged(model, before)


def test_a_method_that_needs_statistics_refuses_to_run_without_calibration() -> None:
    model = build("llama")
    with pytest.raises(ValueError, match="flap needs calibration data"):
        prunereg.shrink(model, "flap", mlp=0.5)


class _FailsOnThirdBlock(ShrinkMethod):
    TARGETS = frozenset({"channels", "blocks"})
    STATISTICS = frozenset({"channel_moments"})

    def __init__(self) -> None:
        self.calls = 0

    def channel_scores(self, weight: torch.Tensor, statistics: prunereg.ChannelStatistics) -> torch.Tensor:
        self.calls += 1
        if self.calls == 5:  # the third block's MLP: two blocks are shrunk already
            raise RuntimeError("scoring failed")
        return weight.abs().sum(dim=0)

    def block_score(self, statistics: prunereg.BlockStatistics) -> float:
        return 0.0


def test_a_failure_midway_puts_every_tensor_attribute_and_config_value_back() -> None:
    model = build("llama")
    before = _state(model)
    with pytest.raises(RuntimeError, match="scoring failed"):
        prunereg.shrink(model, _FailsOnThirdBlock(), calibration_ids(), mlp=0.5, heads=0.5, layers=1)
    _assert_unchanged(model, before)
    assert model.model.layers[0].mlp.down_proj.in_features == 48
    assert model.model.layers[0].self_attn.q_proj.out_features == 32
    ids = calibration_ids(2, 8, seed=3)
    assert _logits(model, ids).shape == (2, 8, 64)


class _WidthAndDepth(ShrinkMethod):
    """A third-party method that scores channels, blocks and experts, to remove all of them in one call."""

    TARGETS = frozenset({"channels", "blocks", "experts"})
    STATISTICS = frozenset({"channel_moments", "block_cosine", "expert_routing"})

    def channel_scores(self, weight: torch.Tensor, statistics: prunereg.ChannelStatistics) -> torch.Tensor:
        assert statistics.sq_norms is not None
        return weight.norm(dim=0) * statistics.sq_norms.sqrt()

    def block_score(self, statistics: prunereg.BlockStatistics) -> float:
        return 1 - statistics.cosine_sum / statistics.n_tokens

    def expert_scores(self, statistics: prunereg.ExpertStatistics) -> torch.Tensor:
        return statistics.gate_sum


@pytest.mark.parametrize(
    ("architecture", "options"),
    [("llama", {"mlp": 0.5, "heads": 0.5, "layers": 1}), ("mixtral", {"experts": 0.5, "heads": 0.5, "layers": 2})],
)
def test_one_call_removes_width_and_depth_together_and_the_model_still_reloads(
    architecture: str, options: dict[str, Any], tmp_path: Any
) -> None:
    model = build(architecture)
    report = prunereg.shrink(model, _WidthAndDepth(), calibration_ids(), **options)
    assert len(report.removed_blocks) == options["layers"]
    ids = calibration_ids(2, 12, seed=7)
    expected = _logits(model, ids)
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(_logits(reloaded, ids), expected, rtol=0, atol=0)


def test_the_models_train_and_eval_modes_are_kept() -> None:
    model = build("llama").train()
    model.model.layers[1].eval()
    prunereg.shrink(model, "wanda_sp", calibration_ids(), mlp=0.5)
    assert model.training and model.model.layers[0].training and not model.model.layers[1].training


def test_without_restore_on_error_a_failure_leaves_the_blocks_already_shrunk() -> None:
    model = build("llama")
    with pytest.raises(RuntimeError, match="scoring failed"):
        prunereg.shrink(model, _FailsOnThirdBlock(), calibration_ids(), mlp=0.5, heads=0.5, restore_on_error=False)
    assert model.model.layers[0].mlp.down_proj.in_features == 24  # shrunk before the failure, and kept so
    assert model.model.layers[2].mlp.down_proj.in_features == 48
    assert model.config.intermediate_size == 48  # the config is rewritten only at the end


def test_calibration_may_be_a_text_tokenised_as_oneshot_tokenises_it(tmp_path: Any) -> None:
    from tests.support.tiny_lm import random_text, save_tiny_llama_folder

    save_tiny_llama_folder(tmp_path / "dense")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "dense")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense").eval()
    report = prunereg.shrink(
        model, "wanda_sp", random_text(300, seed=1), tokenizer=tokenizer, num_samples=4, seq_len=16, mlp=0.5
    )
    assert report.n_tokens == 64 and model.config.intermediate_size == 24
    streamed = prunereg.shrink_folder(
        tmp_path / "dense", tmp_path / "small", "wanda_sp", random_text(300, seed=1), num_samples=4, seq_len=16, mlp=0.5
    )
    assert streamed.n_tokens == 64


def test_token_ids_beyond_the_vocabulary_are_refused_before_anything_changes() -> None:
    model = build("llama")
    before = _state(model)
    with pytest.raises(ValueError, match="hold the token id 1000, but the model's vocabulary has 64 tokens"):
        prunereg.shrink(model, "wanda_sp", torch.full((2, 8), 1000), mlp=0.5)
    _assert_unchanged(model, before)
