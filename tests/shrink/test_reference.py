"""Each shrink method against a float64 transcription of its paper on a tiny model.

The transcriptions follow the papers' procedures with plain tensor code (hooks
that keep every token, ``torch.var``, explicit slicing), block after block as
the engine works: the statistics of block i are those of the model whose blocks
before i are already shrunk. The engine runs in float32 at matmul precision
"highest"; the same units must go, and the kept weights and compensated biases
must match the float64 ones.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import prunereg  # noqa: E402
from tests.shrink.models import build, calibration_ids  # noqa: E402

Score = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (weight [out, in], inputs [tokens, in]) -> [in]


def _flap(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """FLAP (An et al. 2024), WIFV: the sample variance of each input over the tokens times the squared column norm."""
    return x.var(dim=0, unbiased=True) * weight.pow(2).sum(dim=0)


def _wanda_sp(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Wanda-sp: |W_ij| * ||X_j||_2 summed over the column."""
    return (weight.abs() * x.norm(dim=0)).sum(dim=0)


def _magnitude_sp(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return weight.norm(dim=0)


def _inputs_of(model: nn.Module, module: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Every token's input to ``module`` over the calibration set, float64 ``[tokens, in]``."""
    seen: list[torch.Tensor] = []
    handle = module.register_forward_pre_hook(lambda _m, args: seen.append(args[0].reshape(-1, args[0].shape[-1])))
    try:
        with torch.no_grad():
            for batch in ids.split(2):
                model(batch, use_cache=False)
    finally:
        handle.remove()
    return torch.cat(seen)


def _lowest(scores: torch.Tensor, n_remove: int) -> tuple[torch.Tensor, torch.Tensor]:
    order = scores.argsort()
    return order[n_remove:].sort().values, order[:n_remove].sort().values


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype)
    layer.weight = nn.Parameter(weight.clone())
    if bias is not None:
        layer.bias = nn.Parameter(bias.clone())
    return layer


def _reference_channels(model: nn.Module, ids: torch.Tensor, score: Score, compensate: bool) -> nn.Module:
    """The whole procedure on a float64 copy: per block, remove half the MLP channels and one of two KV groups.

    FLAP observes every block on the dense model (its authors' code feeds each
    block the dense block's outputs); the others on the blocks already cut.
    """
    ref = copy.deepcopy(model).double()
    dense = copy.deepcopy(ref)
    observed = dense if score is _flap else ref
    head_dim, n_heads, n_kv = 8, 4, 2
    group_width = (n_heads // n_kv) * head_dim
    for layer, seen in zip(ref.model.layers, observed.model.layers, strict=True):
        mlp, attention = layer.mlp, layer.self_attn
        x_mlp = _inputs_of(observed, seen.mlp.down_proj, ids)
        x_attn = _inputs_of(observed, seen.self_attn.o_proj, ids)
        # MLP: half of the channels.
        down = mlp.down_proj.weight.detach()
        kept, removed = _lowest(score(down, x_mlp), down.shape[1] // 2)
        bias = down[:, removed] @ x_mlp.mean(dim=0)[removed] if compensate else None
        mlp.gate_proj = _linear(
            mlp.gate_proj.weight.detach()[kept], torch.zeros(len(kept), dtype=torch.float64) if compensate else None
        )
        mlp.up_proj = _linear(
            mlp.up_proj.weight.detach()[kept], torch.zeros(len(kept), dtype=torch.float64) if compensate else None
        )
        mlp.down_proj = _linear(down[:, kept], bias)
        # Attention: one of the two key/value groups, with its query heads; a group scores its o_proj columns' sum.
        o = attention.o_proj.weight.detach()
        channel_scores = score(o, x_attn) ** (2 if score is _flap else 1)  # FLAP's code squares the attention metric
        group_scores = channel_scores.reshape(n_kv, group_width).sum(dim=1)
        [keep_group] = _lowest(group_scores, 1)[0].tolist()
        [drop_group] = _lowest(group_scores, 1)[1].tolist()
        q_rows = torch.arange(keep_group * group_width, (keep_group + 1) * group_width)
        kv_rows = torch.arange(keep_group * head_dim, (keep_group + 1) * head_dim)
        dropped = torch.arange(drop_group * group_width, (drop_group + 1) * group_width)
        o_bias = o[:, dropped] @ x_attn.mean(dim=0)[dropped] if compensate else None
        zeros = (lambda n: torch.zeros(n, dtype=torch.float64)) if compensate else (lambda n: None)
        attention.q_proj = _linear(attention.q_proj.weight.detach()[q_rows], zeros(len(q_rows)))
        attention.k_proj = _linear(attention.k_proj.weight.detach()[kv_rows], zeros(len(kv_rows)))
        attention.v_proj = _linear(attention.v_proj.weight.detach()[kv_rows], zeros(len(kv_rows)))
        attention.o_proj = _linear(o[:, q_rows], o_bias)
    return ref


@pytest.mark.parametrize(
    ("method", "score", "compensate"),
    [("flap", _flap, True), ("wanda_sp", _wanda_sp, False), ("magnitude_sp", _magnitude_sp, False)],
)
def test_channel_and_head_methods_match_their_float64_transcription(
    method: str, score: Score, compensate: bool
) -> None:
    model = build("llama")
    ids = calibration_ids(8, 16)
    reference = _reference_channels(model, ids.clone(), score, compensate)
    prunereg.shrink(model, method, ids, mlp=0.5, heads=0.5, matmul_precision="highest")
    expected = reference.state_dict()
    got = model.state_dict()
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name].double(), tensor, rtol=1e-4, atol=1e-5, msg=name)


def test_block_influence_matches_shortgpt_in_float64() -> None:
    model = build("llama")
    ids = calibration_ids(8, 16)
    ref = copy.deepcopy(model).double()
    pairs: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {i: [] for i in range(3)}
    handles = [
        layer.register_forward_hook(
            lambda _m, args, out, i=i: pairs[i].append((args[0], out[0] if isinstance(out, tuple) else out))
        )
        for i, layer in enumerate(ref.model.layers)
    ]
    with torch.no_grad():
        for batch in ids.split(2):
            ref(batch, use_cache=False)
    for handle in handles:
        handle.remove()
    expected = []
    for i in range(3):
        x = torch.cat([a.reshape(-1, 32) for a, _ in pairs[i]])
        y = torch.cat([b.reshape(-1, 32) for _, b in pairs[i]])
        expected.append(1 - torch.nn.functional.cosine_similarity(x, y, dim=-1).mean().item())
    report = prunereg.shrink(model, "block_influence", ids, layers=2, matmul_precision="highest")
    assert [block.score for block in report.blocks] == pytest.approx(expected, rel=1e-5)
    assert report.removed_blocks == sorted(sorted(range(3), key=expected.__getitem__)[:2])


def _expert_outputs(experts: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """Every expert's output for every token, ``[experts, tokens, hidden]``: SwiGLU from the stacked tensors."""
    gate, up = torch.einsum("eih,th->eti", experts.gate_up_proj, h).chunk(2, dim=-1)
    return torch.einsum("ehi,eti->eth", experts.down_proj, nn.functional.silu(gate) * up)


def test_reap_matches_its_float64_transcription_on_a_tiny_mixtral() -> None:
    model = build("mixtral")
    ids = calibration_ids(8, 16)
    ref = copy.deepcopy(model).double()
    ref.set_experts_implementation("eager")  # the grouped products take no float64
    for layer in ref.model.layers:
        moe = layer.mlp
        h = _inputs_of(ref, moe, ids)
        probs = torch.softmax(h @ moe.gate.weight.T, dim=-1)
        top_w, top_i = probs.topk(2, dim=-1)
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        norms = _expert_outputs(moe.experts, h).norm(dim=-1)  # [experts, tokens]
        saliency = []
        for e in range(moe.gate.weight.shape[0]):
            tokens, slot = torch.where(top_i == e)
            weighted = top_w[tokens, slot] * norms[e, tokens]
            saliency.append(weighted.mean() if tokens.numel() else torch.tensor(0.0, dtype=torch.float64))
        kept, _ = _lowest(torch.stack(saliency), 2)
        moe.gate.weight = nn.Parameter(moe.gate.weight.detach()[kept])
        moe.experts.gate_up_proj = nn.Parameter(moe.experts.gate_up_proj.detach()[kept])
        moe.experts.down_proj = nn.Parameter(moe.experts.down_proj.detach()[kept])
        moe.gate.num_experts = moe.experts.num_experts = len(kept)
    prunereg.shrink(model, "reap", ids, experts=0.5, matmul_precision="highest")
    expected, got = ref.state_dict(), model.state_dict()
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name].double(), tensor, rtol=1e-4, atol=1e-5, msg=name)
