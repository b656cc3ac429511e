"""Attention modules read out_proj.weight and in_proj_weight directly; pruned, they train for many steps."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn
from torch.func import functional_call

import prunereg
import prunereg.prune as prune


def attention(seed: int = 0) -> nn.MultiheadAttention:
    torch.manual_seed(seed)
    return nn.MultiheadAttention(8, 2, batch_first=True)


def encoder_layer(seed: int = 0) -> nn.TransformerEncoderLayer:
    torch.manual_seed(seed)
    return nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)


def decoder_layer(seed: int = 0) -> nn.TransformerDecoderLayer:
    torch.manual_seed(seed)
    return nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True)


def inputs(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Self-attention arguments: query, key and value (or target and memory) are all ``x``."""
    if isinstance(module, nn.MultiheadAttention):
        return (x, x, x)
    if isinstance(module, nn.TransformerDecoderLayer):
        return (x, x)
    return (x,)


def output(result: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    return result[0] if isinstance(result, tuple) else result


def run(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return output(module(*inputs(module, x)))


def loss(out: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient reaches every weight (a plain sum after LayerNorm is constant)."""
    return (out * torch.linspace(-3.0, 3.0, out.numel()).reshape(out.shape)).sum()


def pruned_values(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor as the pruning defines it now: ``orig * mask`` for pruned ones, unpruned names."""
    values = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        if name.endswith("_mask"):
            continue
        if name.endswith("_orig"):
            base = name.removesuffix("_orig")
            values[base] = tensor * module.get_buffer(base + "_mask")
        else:
            values[name] = tensor
    return values


CASES = [
    (attention, "out_proj.weight"),
    (attention, "in_proj_weight"),
    (encoder_layer, "self_attn.out_proj.weight"),
    (encoder_layer, "self_attn.in_proj_weight"),
    (encoder_layer, "linear1.weight"),
    (decoder_layer, "self_attn.out_proj.weight"),
    (decoder_layer, "multihead_attn.out_proj.weight"),
]


@pytest.mark.parametrize(("build", "name"), CASES)
def test_training_uses_the_pruned_values_in_every_forward(build, name):
    module = build()
    reference = build()  # unpruned: the pruned values are handed to it explicitly
    prune.l1_unstructured(module, name, amount=0.5)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    torch.manual_seed(1)
    for _ in range(4):
        x = torch.randn(2, 3, 8)
        expected = output(functional_call(reference, pruned_values(module), inputs(reference, x)))
        out = run(module, x)
        torch.testing.assert_close(out, expected)
        loss(out).backward()
        optimizer.step()
        optimizer.zero_grad()
    pruned = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
    attribute = name.rpartition(".")[2]
    assert torch.equal(getattr(pruned, attribute) == 0, getattr(pruned, attribute + "_mask") == 0)


def test_eval_fast_path_of_an_encoder_layer_uses_fresh_values():
    layer = encoder_layer()
    prune.l1_unstructured(layer, "self_attn.out_proj.weight", amount=0.5)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    x = torch.randn(2, 3, 8)
    loss(run(layer, x)).backward()
    optimizer.step()
    layer.eval()
    with torch.no_grad():
        out = layer(x)
        expected = functional_call(encoder_layer().eval(), pruned_values(layer), (x,))
    torch.testing.assert_close(out, expected)


def test_torch_fails_on_the_second_backward():
    module = attention()
    torch_prune.l1_unstructured(module.out_proj, "weight", amount=0.5)
    x = torch.randn(2, 3, 8)
    run(module, x).sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        run(module, x).sum().backward()


def _train(layer: nn.Module, steps: int) -> list[dict[str, torch.Tensor]]:
    """``steps`` SGD steps on fixed inputs; every parameter's gradient at each step, by name."""
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    torch.manual_seed(1)
    grads = []
    for _ in range(steps):
        loss(run(layer, torch.randn(2, 3, 8))).backward()
        grads.append({name: p.grad.clone() for name, p in layer.named_parameters()})
        optimizer.step()
        optimizer.zero_grad()
    return grads


@pytest.mark.parametrize(
    ("build", "where", "name"),
    [
        (encoder_layer, "self_attn.out_proj", "weight"),
        (decoder_layer, "multihead_attn.out_proj", "weight"),
        (attention, "out_proj", "weight"),
        (encoder_layer, "self_attn", "in_proj_weight"),
    ],
)
def test_pruning_a_tensor_where_it_lives_trains_as_pruning_it_from_the_layer(build, where, name, recwarn):
    natural, owner = build(), build()
    prune.l1_unstructured(natural.get_submodule(where), name, amount=0.5)  # what a loop over modules does
    prune.l1_unstructured(owner, f"{where}.{name}", amount=0.5)
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]
    for step, (ours, expected) in enumerate(zip(_train(natural, 3), _train(owner, 3))):
        assert ours.keys() == expected.keys()
        for key in ours:
            torch.testing.assert_close(ours[key], expected[key], msg=f"step {step}: {key}")
    assert torch.equal(
        natural.get_submodule(where).get_buffer(name + "_mask"),
        owner.get_submodule(f"{where}").get_buffer(name + "_mask"),
    )


def test_the_fast_path_after_pruning_out_proj_where_it_lives_uses_fresh_values():
    layer = encoder_layer()
    prune.l1_unstructured(layer.self_attn.out_proj, "weight", amount=0.5)
    _train(layer, 1)
    layer.eval()
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        out = layer(x)
        expected = functional_call(encoder_layer().eval(), pruned_values(layer), (x,))
    torch.testing.assert_close(out, expected)


def test_remove_where_it_lives_drops_the_refresh_hooks_above():
    layer = encoder_layer()
    prune.l1_unstructured(layer.self_attn.out_proj, "weight", amount=0.5)
    assert layer._forward_pre_hooks and layer.self_attn._forward_pre_hooks
    prune.remove(layer.self_attn.out_proj, "weight")
    assert not layer._forward_pre_hooks and not layer.self_attn._forward_pre_hooks
    assert not prunereg.is_pruned(layer)


def test_modules_that_no_reader_holds_are_never_looked_up(monkeypatch):
    import gc

    def no_scans(*objects):
        raise AssertionError("gc scan")

    layer = encoder_layer()
    monkeypatch.setattr(gc, "get_referrers", no_scans)
    prune.l1_unstructured(layer.linear1, "weight", amount=0.5)  # a plain Linear: nobody reads it from above in training


def test_masks_equal_torchs_for_the_same_tensor():
    module, reference = attention(), attention()
    prune.l1_unstructured(module, "out_proj.weight", amount=0.3)
    torch_prune.l1_unstructured(reference.out_proj, "weight", amount=0.3)
    assert torch.equal(module.out_proj.weight_mask, reference.out_proj.weight_mask)


def test_remove_drops_the_refresh_hook():
    module = attention()
    prune.l1_unstructured(module, "out_proj.weight", amount=0.5)
    pruned = module.out_proj.weight.detach().clone()
    prunereg.remove(module, "out_proj.weight")
    assert not module._forward_pre_hooks and not prunereg.is_pruned(module)
    assert torch.equal(module.out_proj.weight, pruned)


def test_deepcopy_and_weights_only_load_keep_the_refresh():
    import io

    module = attention()
    prune.l1_unstructured(module, "out_proj.weight", amount=0.5)
    clone = copy.deepcopy(module)
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    with prunereg.safe_globals(nn.MultiheadAttention, nn.modules.linear.NonDynamicallyQuantizableLinear):
        loaded = torch.load(buffer, weights_only=True)
    for copied in (clone, loaded):
        optimizer = torch.optim.SGD(copied.parameters(), lr=0.1)
        for _ in range(2):
            x = torch.randn(2, 3, 8)
            loss(run(copied, x)).backward()
            optimizer.step()
