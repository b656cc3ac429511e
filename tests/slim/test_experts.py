"""Fused experts (one tensor for every expert, as transformers 5 holds them) lose channels inside every expert.

The experts' tensors share one width, so channel j of every expert goes
together, as inside a grouped convolution; the routers and the experts module
keep their ``hidden_dim`` and ``intermediate_dim`` true, the config states the
new widths, and stock ``from_pretrained`` reloads the model.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunereg
from prunereg._slim.graph import through_export
from tests.slim.helpers import assert_unchanged, exact_state, outputs


class GroupedExperts(nn.Module):
    """Top-1 routed experts computed as transformers' ``grouped_mm`` implementation does, in plain torch."""

    def __init__(self, experts: int = 3, hidden: int = 8, width: int = 16) -> None:
        super().__init__()
        self.num_experts, self.hidden_dim, self.intermediate_dim = experts, hidden, width
        self.router = nn.Linear(hidden, experts, bias=False)
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * width, hidden) / hidden**0.5)
        self.down_proj = nn.Parameter(torch.randn(experts, hidden, width) / width**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.hidden_dim)
        chosen = self.router(flat).argmax(-1)
        expert, order = torch.sort(chosen)
        offsets = torch.cumsum(torch.histc(expert.float(), self.num_experts, 0, self.num_experts - 1), 0)
        offsets = offsets.to(torch.int32)
        gate_up = torch._grouped_mm(flat[order], self.gate_up_proj.transpose(-2, -1), offs=offsets)
        gate, up = gate_up.chunk(2, dim=-1)
        out = torch._grouped_mm(F.silu(gate) * up, self.down_proj.transpose(-2, -1), offs=offsets)
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel())
        return out[back].reshape(x.shape)


class ExpertsNet(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.inp, self.experts, self.head = nn.Linear(4, 8), GroupedExperts(width=width), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        return self.head(h + self.experts(h))


def _experts_net(width: int = 16) -> tuple[ExpertsNet, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return ExpertsNet(width).eval(), (torch.randn(2, 16, 4),)


def _mask_channels(experts: GroupedExperts, pruned: list[int]) -> None:
    """Prune the gate row and the up row of the channels ``pruned``, in every expert."""
    mask = torch.ones_like(experts.gate_up_proj)
    mask[:, pruned] = 0
    mask[:, [p + experts.intermediate_dim for p in pruned]] = 0
    prunereg.get("custom_from_mask").apply(experts, "gate_up_proj", mask=mask)


@pytest.mark.parametrize(
    ("capture", "dtype", "pruned"),
    [("eager", torch.float32, [1, 4, 5, 6]), ("export", torch.bfloat16, [1, 4, 5, 6, 8, 9, 10, 11])],
)  # torch exports its grouped product in bfloat16 only
def test_channels_masked_in_every_expert_go_and_the_model_computes_what_the_masked_one_did(
    capture: str, dtype: torch.dtype, pruned: list[int]
) -> None:
    model, inputs = _experts_net()
    model, inputs = model.to(dtype), (inputs[0].to(dtype),)
    _mask_channels(model.experts, pruned)
    expected = outputs(model, inputs)
    gate_up, down = model.experts.gate_up_proj.detach().clone(), model.experts.down_proj.detach().clone()
    with through_export() if capture == "export" else contextlib.nullcontext():
        report = prunereg.slim(model, inputs)
    kept = torch.tensor([k for k in range(16) if k not in pruned])
    assert model.experts.intermediate_dim == len(kept) and not report.notes
    torch.testing.assert_close(model.experts.gate_up_proj, gate_up[:, torch.cat([kept, kept + 16])], rtol=0, atol=0)
    torch.testing.assert_close(model.experts.down_proj, down[:, :, kept], rtol=0, atol=0)
    torch.testing.assert_close(outputs(model, inputs), expected, rtol=0, atol=1e-6 if capture == "eager" else 1e-2)


def test_channels_masked_past_a_width_of_whole_16_bytes_stay_at_zero_with_a_note() -> None:
    model, inputs = _experts_net()
    model, inputs = model.to(torch.bfloat16), (inputs[0].to(torch.bfloat16),)
    _mask_channels(model.experts, list(range(10)))  # 6 left; bfloat16 rows of 16 bytes hold 8
    expected = outputs(model, inputs)
    report = prunereg.slim(model, inputs)
    assert model.experts.intermediate_dim == 8
    assert report.notes == [
        "2 pruned channels of 'experts.gate_up_proj' stay, at zero: a grouped matrix product reads them, "
        "in widths of whole 16 bytes"
    ]
    torch.testing.assert_close(outputs(model, inputs), expected, rtol=0, atol=1e-2)


def test_channels_masked_in_one_expert_only_stay_as_every_expert_keeps_one_width() -> None:
    model, inputs = _experts_net()
    mask = torch.ones(3, 32, 8)
    mask[0, [1, 17]] = 0  # channel 1 of expert 0 only
    prunereg.get("custom_from_mask").apply(model.experts, "gate_up_proj", mask=mask)
    prunereg.remove(model.experts, "gate_up_proj")
    prunereg.slim(model, inputs)
    assert model.experts.gate_up_proj.shape == (3, 32, 8)


def test_a_ratio_narrows_the_experts_and_the_stream_with_the_width_attributes_kept_true() -> None:
    model, inputs = _experts_net()
    report = prunereg.slim(model, inputs, ratio=0.5)
    experts = model.experts
    assert experts.gate_up_proj.shape == (3, 16, 4) and experts.down_proj.shape == (3, 4, 8)
    assert (experts.hidden_dim, experts.intermediate_dim) == (4, 8)  # read by the forward, set by the width rule
    assert report.params_after < report.params_before
    assert outputs(model, inputs).shape == (2, 16, 2)


@pytest.mark.parametrize(("dtype", "width"), [(torch.float32, 12), (torch.bfloat16, 16)])
def test_the_experts_keep_a_width_of_whole_16_bytes_as_torchs_grouped_product_wants(
    dtype: torch.dtype, width: int
) -> None:
    model, inputs = _experts_net()
    model.to(dtype)
    prunereg.slim(model, (inputs[0].to(dtype),), ratio=0.3)  # 0.3 of 16 leaves 11: rounded up to 16 bytes' worth
    assert model.experts.intermediate_dim == width and model.experts.down_proj.shape[2] == width
    assert outputs(model, (inputs[0].to(dtype),)).shape == (2, 16, 2)


# -- Hugging Face mixtures of experts ---------------------------------------------------------------------------
_COMMON: dict[str, Any] = {
    "vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 64, "num_experts_per_tok": 2,
}  # fmt: skip
MIXTURES: dict[str, tuple[str, dict[str, Any], str]] = {
    "mixtral": ("Mixtral", {"intermediate_size": 24, "num_local_experts": 4}, "intermediate_size"),
    "qwen3_moe": (
        "Qwen3Moe",
        {"moe_intermediate_size": 24, "intermediate_size": 40, "num_experts": 4},
        "moe_intermediate_size",
    ),
    "qwen2_moe (a shared expert)": (
        "Qwen2Moe",
        {"moe_intermediate_size": 24, "intermediate_size": 40, "shared_expert_intermediate_size": 48, "num_experts": 4},
        "moe_intermediate_size",
    ),
    "olmoe": ("Olmoe", {"intermediate_size": 24, "num_experts": 4}, "intermediate_size"),
    "deepseek_v3 (a dense first block, latent attention)": (
        "DeepseekV3",
        {
            "intermediate_size": 80,
            "moe_intermediate_size": 24,
            "n_routed_experts": 4,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "q_lora_rank": 16,
            "kv_lora_rank": 16,
            "qk_rope_head_dim": 4,
            "qk_nope_head_dim": 4,
            "v_head_dim": 8,
            "n_shared_experts": 1,
        },
        "moe_intermediate_size",
    ),
}


def _mixture(kind: str, fields: dict[str, Any], implementation: str) -> tuple[nn.Module, tuple[torch.Tensor]]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = getattr(transformers, f"{kind}Config")(**_COMMON, **fields)
    config._experts_implementation = implementation
    model = getattr(transformers, f"{kind}ForCausalLM")(config).eval()
    return model, (torch.randint(1, 128, (1, 12)),)


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm"])
@pytest.mark.parametrize("mixture", MIXTURES.values(), ids=MIXTURES.keys())
def test_a_mixture_of_experts_loses_half_of_every_experts_channels_and_stock_transformers_reloads_it(
    mixture: tuple[str, dict[str, Any], str], implementation: str, tmp_path: Path
) -> None:
    kind, fields, width_field = mixture
    model, inputs = _mixture(kind, fields, implementation)
    report = prunereg.slim(model, inputs, ratio=0.5)
    assert report.config_rewritten and not report.notes
    assert getattr(model.config, width_field) == 12 and model.config.hidden_size == 16
    mixtures = [layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "experts")]
    assert mixtures
    for mixture in mixtures:
        experts, router = mixture.experts, mixture.gate
        assert experts.gate_up_proj.shape == (4, 24, 16) and experts.down_proj.shape == (4, 16, 12)
        assert (experts.intermediate_dim, experts.hidden_dim, router.hidden_dim) == (12, 16, 16)
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    torch.testing.assert_close(outputs(reloaded, inputs), outputs(model, inputs), rtol=0, atol=1e-5)


def test_experts_that_loop_on_values_are_refused_in_one_line_naming_the_module_and_the_model_is_unchanged() -> None:
    kind, fields, _ = MIXTURES["mixtral"]
    model, inputs = _mixture(kind, fields, "eager")
    before = exact_state(model)
    with pytest.raises(
        RuntimeError, match=r"torch\.export \(needed as aten\.nonzero in 'model\.layers\.0\.mlp\.experts'"
    ) as raised:
        prunereg.slim(model, inputs, ratio=0.5)
    assert "\n" not in str(raised.value)
    assert_unchanged(model, before)
