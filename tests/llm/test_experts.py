"""One-shot pruning prunes a fused mixture's experts, each as the Linear layer it was before transformers 5 fused them.

The reference is the same model with every expert's slices as ``nn.Linear``
layers of their own (transformers 4's layout, run by the same loop): pruned by
the same method on the same calibration, it must give the same weights, bit
for bit, and the fused model's masks must be that model's masks stacked.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import prunereg

transformers = pytest.importorskip("transformers")

from tests.shrink.models import tiny_mixtral  # noqa: E402
from tests.support.tiny_lm import calibration_ids  # noqa: E402


class LinearExperts(nn.Module):
    """A fused experts module's experts as Linear layers (``gate_up.3``, ``down.3``), run by transformers' loop."""

    def __init__(self, fused: nn.Module) -> None:
        super().__init__()
        self.num_experts, self.act_fn = fused.num_experts, fused.act_fn
        self.gate_up = nn.ModuleList(_linear(w) for w in fused.gate_up_proj.detach())
        self.down = nn.ModuleList(_linear(w) for w in fused.down_proj.detach())

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        final = torch.zeros_like(hidden_states)
        mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
        for expert in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
            e = int(expert[0])
            if e == self.num_experts:
                continue
            position, token = torch.where(mask[e])
            gate, up = self.gate_up[e](hidden_states[token]).chunk(2, dim=-1)
            out = self.down[e](self.act_fn(gate) * up) * top_k_weights[token, position, None]
            final.index_add_(0, token, out.to(final.dtype))
        return final


def _linear(weight: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.weight.data.copy_(weight)
    return layer


def _pair() -> tuple[nn.Module, nn.Module]:
    fused = tiny_mixtral()
    unfused = copy.deepcopy(fused)
    for layer in unfused.model.layers:
        layer.mlp.experts = LinearExperts(layer.mlp.experts)
    return fused, unfused


CASES = [("wanda", {}), ("sparsegpt", {}), ("sparsegpt", {"pattern": "2:4"}), ("wanda", {"allocation": "owl"})]


@pytest.mark.parametrize(("method", "options"), CASES, ids=lambda v: str(v))
def test_each_expert_is_pruned_as_its_own_linear_layer_was_bit_for_bit(method: str, options: dict) -> None:
    fused, unfused = _pair()
    ids = calibration_ids(4, 16)
    report = prunereg.oneshot(fused, method, calibration=ids, **options)
    expected = prunereg.oneshot(unfused, method, calibration=ids, **options)
    for block, reference in zip(fused.model.layers, unfused.model.layers, strict=True):
        experts, linear = block.mlp.experts, reference.mlp.experts
        for e in range(experts.num_experts):
            assert torch.equal(experts.gate_up_proj[e], linear.gate_up[e].weight)
            assert torch.equal(experts.down_proj[e], linear.down[e].weight)
    renamed = [
        (r.name.replace("gate_up_proj", "gate_up").replace("down_proj", "down"), r.sparsity) for r in report.layers
    ]
    assert sorted(renamed) == sorted((r.name, r.sparsity) for r in expected.layers)
    share = sum(int((p == 0).sum()) for n, p in fused.named_parameters() if "experts" in n)
    assert share / sum(p.numel() for n, p in fused.named_parameters() if "experts" in n) > 0.45


def test_with_permanent_false_the_fused_tensor_holds_the_stacked_masks_and_remove_makes_them_plain() -> None:
    fused, unfused = _pair()
    ids = calibration_ids(4, 16)
    prunereg.oneshot(fused, "wanda", calibration=ids, permanent=False)
    prunereg.oneshot(unfused, "wanda", calibration=ids, permanent=False)
    experts, linear = fused.model.layers[1].mlp.experts, unfused.model.layers[1].mlp.experts
    assert prunereg.is_pruned(experts) and experts.gate_up_proj_mask.shape == experts.gate_up_proj_orig.shape
    stacked = torch.stack([layer.weight_mask for layer in linear.gate_up])
    assert torch.equal(experts.gate_up_proj_mask, stacked)
    prunereg.remove(experts, "gate_up_proj")
    prunereg.remove(experts, "down_proj")
    assert torch.equal(experts.gate_up_proj, torch.stack([layer.weight for layer in linear.gate_up]))
    assert isinstance(experts.gate_up_proj, nn.Parameter) and not prunereg.is_pruned(experts)


def test_an_expert_no_token_reaches_is_left_dense_and_named() -> None:
    fused = tiny_mixtral()

    def never_three(module: nn.Module, args: object, output: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        logits, scores, chosen = output
        return logits, scores, torch.where(chosen == 3, torch.zeros_like(chosen), chosen)

    for layer in fused.model.layers:
        layer.mlp.gate.register_forward_hook(never_three)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = prunereg.oneshot(fused, "wanda", calibration=calibration_ids(4, 16))
    assert any("mlp.experts.gate_up_proj.3" in str(w.message) and "left dense" in str(w.message) for w in caught)
    assert "model.layers.0.mlp.experts.down_proj.3" in report.unpruned
    assert bool((fused.model.layers[0].mlp.experts.gate_up_proj[3] != 0).all())


def test_a_transposed_mixture_is_pruned_in_each_experts_input_order() -> None:
    torch.manual_seed(0)
    config = transformers.GptOssConfig(
        vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["full_attention", "full_attention"],
    )  # fmt: skip
    model = transformers.GptOssForCausalLM(config).eval()
    prunereg.oneshot(model, "sparsegpt", calibration=calibration_ids(4, 16), pattern="2:4")
    stored = model.model.layers[0].mlp.experts.gate_up_proj  # [experts, in, out]
    per_output = stored.transpose(1, 2).reshape(-1, 4)  # each expert's rows, in groups of 4 inputs
    assert bool(((per_output != 0).sum(dim=1) <= 2).all())


def test_layers_globs_select_experts_too() -> None:
    fused = tiny_mixtral()
    report = prunereg.oneshot(fused, "wanda", calibration=calibration_ids(4, 16), layers=["*.experts.down_proj.*"])
    assert {r.name.split(".mlp.")[1].rsplit(".", 1)[0] for r in report.layers} == {"experts.down_proj"}
    assert bool((fused.model.layers[0].mlp.experts.gate_up_proj != 0).all())


def test_a_forward_a_hook_set_on_the_mixture_runs_and_stays_and_the_implementation_is_put_back() -> None:
    fused = tiny_mixtral()
    implementation = fused.config._experts_implementation
    experts = fused.model.layers[0].mlp.experts
    original, calls = experts.forward, []

    def hooked(*args: object, **kwargs: object) -> torch.Tensor:  # as accelerate's hooks wrap a module's forward
        calls.append(fused.config._experts_implementation)
        return original(*args, **kwargs)

    experts.forward = hooked
    prunereg.oneshot(fused, "wanda", calibration=calibration_ids(4, 16))
    assert experts.forward is hooked and "eager" in calls and implementation in calls
    assert fused.config._experts_implementation == implementation
    assert "forward" not in fused.model.layers[1].mlp.experts.__dict__
