"""Modules that compute a width from an attribute or from their input: slimmed with the attribute kept true, or kept
whole, never silently computing something else (two heads of width 4 read as four heads of width 2)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunereg
from prunereg._slim import rules
from tests.slim.helpers import assert_unchanged, exact_state, outputs

HEADS_KEPT = torch.cat([torch.arange(0, 8), torch.arange(16, 24), torch.arange(32, 40)])
"""With the first units of every group kept: the rows of heads 0 and 1 of the queries, keys and values."""


class First(prunereg.Importance):
    """Keeps the first units of every group, so that the slimmed model can be computed by hand."""

    def __call__(self, group: object, values: object) -> torch.Tensor:
        return torch.arange(group.size, 0, -1, dtype=torch.float64)  # type: ignore[attr-defined]


class Att(nn.Module):
    """Four heads of width 4 over a 16-wide input; ``how`` says where its view takes the head count and width from."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how, self.num_heads, self.head_dim, self.h = how, 4, 4, 4
        self.qkv, self.out = nn.Linear(16, 48), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        sizes = {
            "num_heads": (self.num_heads, c // self.num_heads),  # the issue's: the head width from the input
            "constant": (4, 4),
            "c_over_n": (4, c // 4),
            "head_dim": (-1, self.head_dim),
            "heads_only": (self.num_heads, -1),
            "own_attribute": (self.h, c // self.h),  # a head count under a name of its own
        }[self.how]
        q, k, v = (part.view(b, t, *sizes).transpose(1, 2) for part in self.qkv(x).chunk(3, dim=-1))
        mixed = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, -1)
        return self.out(mixed)


class M(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.inp, self.att, self.head = nn.Linear(8, 16), Att(how), nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.att(self.inp(x)))


def by_hand(model: M, x: torch.Tensor) -> torch.Tensor:
    """``model`` with the first half of every group kept (two heads of width 4), computed without slimming."""
    with torch.no_grad():
        h = F.linear(x, model.inp.weight[:8], model.inp.bias[:8])
        qkv = F.linear(h, model.att.qkv.weight[HEADS_KEPT][:, :8], model.att.qkv.bias[HEADS_KEPT])
        q, k, v = (part.view(1, 5, 2, 4).transpose(1, 2) for part in qkv.chunk(3, dim=-1))
        mixed = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 5, 8)
        mixed = F.linear(mixed, model.att.out.weight[:8, :8], model.att.out.bias[:8])
        return F.linear(mixed, model.head.weight[:, :8], model.head.bias)


@pytest.fixture
def no_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rules, "_RULES", {})


def _built(how: str) -> tuple[M, torch.Tensor]:
    torch.manual_seed(0)
    return M(how).eval(), torch.randn(1, 5, 8)


@pytest.mark.parametrize("how", ["num_heads", "head_dim", "heads_only"])
def test_heads_read_from_a_head_count_attribute_slim_with_the_attribute_kept_true(how: str) -> None:
    model, x = _built(how)
    expected = by_hand(copy.deepcopy(model), x)
    report = prunereg.slim(model, x, ratio=0.5, importance=First())
    assert model.att.num_heads == 2 and model.att.head_dim == 4 and model.att.qkv.weight.shape == (24, 8)
    assert report.params_after < report.params_before and not report.notes
    torch.testing.assert_close(outputs(model, (x,)), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["constant", "c_over_n", "own_attribute"])
def test_a_module_whose_sizes_slimming_cannot_set_is_kept_whole_and_named_never_silently_wrong(
    how: str, no_rules: None
) -> None:
    model, x = _built(how)
    dense = outputs(model, (x,))
    with pytest.warns(UserWarning, match=r"kept 'att' whole: the slimmed model .*register_width_rule\(Att, \.\.\.\)"):
        report = prunereg.slim(model, x, ratio=0.5, importance=First())
    assert model.att.qkv.weight.shape == (48, 16) and model.att.num_heads == 4
    assert any("kept 'att' whole" in note for note in report.notes)
    torch.testing.assert_close(outputs(model, (x,)), dense, rtol=0, atol=0)


def _masked_half(model: M) -> None:
    """Masks pruning what :func:`by_hand` removes: the last 8 channels of ``inp``, heads 2 and 3, ``out``'s last 8."""
    rows = torch.ones(16)
    rows[8:] = 0
    for layer in (model.inp, model.att.out):
        prunereg.get("custom_from_mask").apply(layer, "weight", mask=rows[:, None].expand_as(layer.weight).clone())
        prunereg.get("custom_from_mask").apply(layer, "bias", mask=rows.clone())
    heads = torch.zeros(48)
    heads[HEADS_KEPT] = 1
    prunereg.get("custom_from_mask").apply(model.att.qkv, "weight", mask=heads[:, None].expand(48, 16).clone())
    prunereg.get("custom_from_mask").apply(model.att.qkv, "bias", mask=heads.clone())


def test_heads_the_masks_pruned_read_as_four_narrower_heads_are_refused_naming_the_module_and_the_shapes(
    no_rules: None,
) -> None:
    model, x = _built("own_attribute")
    _masked_half(model)
    before = exact_state(model)
    with pytest.raises(prunereg.SlimError) as refused:
        prunereg.slim(model, x)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "the slimmed model would compute something else than planned: 'att' makes a tensor of shape [1, 5, 4, 2] by "
        "aten.view where the plan has [1, 5, 2, 4]"
    )
    assert "slimming does not set (it holds self.h = 4): " in message  # num_heads was set, head_dim stays
    assert message.endswith("pass ignore=['att'] to keep that module whole, or register a width rule for it")
    assert_unchanged(model, before)


def test_a_registered_width_rule_slims_a_module_by_a_ratio_and_by_masks_to_what_the_plan_says(
    no_rules: None,
) -> None:
    prunereg.register_width_rule(Att, h=lambda module: module.out.in_features // module.head_dim)
    model, x = _built("own_attribute")
    expected = by_hand(copy.deepcopy(model), x)
    prunereg.slim(model, x, ratio=0.5, importance=First())
    assert model.att.h == 2
    torch.testing.assert_close(outputs(model, (x,)), expected, rtol=1e-5, atol=1e-6)

    model, x = _built("own_attribute")
    _masked_half(model)
    masked = outputs(model, (x,))
    prunereg.slim(model, x)
    assert model.att.h == 2 and model.att.qkv.weight_orig.shape == (24, 8)
    torch.testing.assert_close(outputs(model, (x,)), masked, rtol=1e-5, atol=1e-6)


def test_a_rule_named_by_its_class_path_applies_to_subclasses_without_importing_it(no_rules: None) -> None:
    class Narrow(Att):
        pass

    prunereg.register_width_rule(f"{Att.__module__}.{Att.__qualname__}", h=lambda m: m.out.in_features // 4)
    torch.manual_seed(0)
    model, x = M("own_attribute").eval(), torch.randn(1, 5, 8)
    model.att.__class__ = Narrow
    expected = by_hand(copy.deepcopy(model), x)
    prunereg.slim(model, x, ratio=0.5, importance=First())
    torch.testing.assert_close(outputs(model, (x,)), expected, rtol=1e-5, atol=1e-6)


def test_bad_width_rules_are_refused_in_one_line(no_rules: None) -> None:
    with pytest.raises(TypeError, match=r"needs an nn\.Module class"):
        prunereg.register_width_rule(int, h=len)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"or its 'package\.module\.Class' name"):
        prunereg.register_width_rule("Att", h=len)
    with pytest.raises(ValueError, match="names no attribute"):
        prunereg.register_width_rule(Att)
    with pytest.raises(TypeError, match=r"the rule for .*Att.h must be callable"):
        prunereg.register_width_rule(Att, h=2)  # type: ignore[arg-type]
    prunereg.register_width_rule(Att, h=lambda module: 2.5)  # type: ignore[arg-type, return-value]
    model, x = _built("own_attribute")
    before = exact_state(model)
    with pytest.raises(TypeError, match=r"the width rule for .*Att.h gave 2.5 for 'att', not an int"):
        prunereg.slim(model, x, ratio=0.5)
    assert_unchanged(model, before)


class FusedAttention(nn.Module):
    """timm's ``Attention``: one ``qkv`` reshaped to (3, heads, width) and unbound, its widths in attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.attn_dim = 4, 4, 16
        self.qkv, self.proj, self.head = nn.Linear(16, 48), nn.Linear(16, 16), nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        mixed = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, self.attn_dim)
        return self.head(self.proj(mixed))


def test_fused_qkv_unbound_after_a_reshape_into_three_parts_loses_whole_heads_with_its_attributes_true() -> None:
    torch.manual_seed(0)
    model, x = FusedAttention().eval(), torch.randn(1, 5, 16)
    with torch.no_grad():
        q, k, v = (part.view(1, 5, 2, 4).transpose(1, 2) for part in model.qkv(x)[..., HEADS_KEPT].chunk(3, dim=-1))
        mixed = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 5, 8)
        mixed = F.linear(mixed, model.proj.weight[:8, :8], model.proj.bias[:8])
        expected = F.linear(mixed, model.head.weight[:, :8], model.head.bias)
    report = prunereg.slim(model, x, ratio=0.5, importance=First())
    assert (model.num_heads, model.head_dim, model.attn_dim) == (2, 4, 8) and not report.notes
    assert model.qkv.weight.shape == (24, 16)
    torch.testing.assert_close(outputs(model, (x,)), expected, rtol=1e-5, atol=1e-6)


class _ConvBn(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class CrossStage(nn.Module):
    """timm's CSP stage (``timm.models.cspnet.CrossStage``): its expanded channels split in two by an attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.expand_chs = 8
        self.conv_exp, self.block, self.conv_transition = _ConvBn(3, 8), _ConvBn(4, 4), _ConvBn(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs, xb = self.conv_exp(x).split(self.expand_chs // 2, dim=1)
        return self.conv_transition(torch.cat([xs, self.block(xb)], dim=1))


CrossStage.__module__, CrossStage.__qualname__ = "timm.models.cspnet", "CrossStage"


def test_a_csp_stage_splitting_by_its_expanded_width_slims_by_the_built_in_rule_to_the_masked_outputs() -> None:
    torch.manual_seed(0)
    model, x = CrossStage().eval(), torch.randn(1, 3, 4, 4)
    rows = torch.ones(8)
    rows[[1, 5]] = 0  # channel 1 of each half: the split couples them
    conv, norm = model.conv_exp.conv, model.conv_exp.bn
    prunereg.get("custom_from_mask").apply(conv, "weight", mask=rows.reshape(8, 1, 1, 1).expand(8, 3, 1, 1).clone())
    for name in ("weight", "bias"):
        prunereg.get("custom_from_mask").apply(norm, name, mask=rows.clone())
    masked = outputs(model, (x,))
    prunereg.slim(model, x)
    assert model.expand_chs == 6 and model.conv_exp.conv.out_channels == 6
    torch.testing.assert_close(outputs(model, (x,)), masked, rtol=1e-5, atol=1e-6)


class Bottle2neck(nn.Module):
    """timm's Res2Net block (``timm.models.res2net.Bottle2neck``): parts of ``self.width`` channels, one conv each."""

    def __init__(self) -> None:
        super().__init__()
        self.width = 4
        self.conv1 = nn.Conv2d(3, 8, 1, bias=False)
        self.convs = nn.ModuleList(nn.Conv2d(4, 4, 3, padding=1, bias=False) for _ in range(2))
        self.conv3 = nn.Conv2d(8, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(F.relu(self.conv1(x)), self.width, 1)
        first = F.relu(self.convs[0](parts[0]))
        second = F.relu(self.convs[1](first + parts[1]))
        return self.conv3(torch.cat([first, second], 1))


Bottle2neck.__module__, Bottle2neck.__qualname__ = "timm.models.res2net", "Bottle2neck"


def test_a_res2net_block_splitting_by_its_part_width_slims_by_the_built_in_rule() -> None:
    torch.manual_seed(0)
    model, x = Bottle2neck().eval(), torch.randn(1, 3, 4, 4)
    for layer, rows in ((model.conv1, [1, 5]), (model.convs[0], [1])):  # channel 1 of both parts, and what adds to it
        mask = torch.ones_like(layer.weight)
        mask[rows] = 0
        prunereg.get("custom_from_mask").apply(layer, "weight", mask=mask)
    masked = outputs(model, (x,))
    report = prunereg.slim(model, x)
    assert model.width == model.convs[0].in_channels == 3 and report.removed == 1
    torch.testing.assert_close(outputs(model, (x,)), masked, rtol=1e-5, atol=1e-6)


class BiasedAtt(nn.Module):
    """Four heads, a per-head table of biases looked up by index and, in eval mode, cached (timm's LeViT does so)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.head_dim = 4, 4
        self.qkv, self.out = nn.Linear(16, 48), nn.Linear(16, 16)
        self.table = nn.Parameter(torch.randn(4, 9))
        self.register_buffer("index", torch.randint(9, (5, 5)))
        self.cache: dict[str, torch.Tensor] = {}

    def biases(self) -> torch.Tensor:
        if self.training:
            return self.table[:, self.index]
        if "biases" not in self.cache:
            self.cache["biases"] = self.table[:, self.index]
        return self.cache["biases"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p.view(b, t, self.num_heads, self.head_dim).transpose(1, 2) for p in self.qkv(x).chunk(3, dim=-1))
        scores = q @ k.transpose(-2, -1) * 0.5 + self.biases()
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1))


def _biased(*, warm: bool = False) -> tuple[nn.Sequential, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), BiasedAtt(), nn.Linear(16, 2)).eval()
    x = torch.randn(1, 5, 8)
    if warm:
        outputs(model, (x,))  # the cache holds the biases, as after any inference in eval mode
    return model, x


def test_a_table_looked_up_by_index_loses_the_heads_its_attention_loses_and_slimmings_forwards_leave_no_cache() -> None:
    model, x = _biased()
    prunereg.slim(model, x, ratio=0.5, importance=First())
    attention = model[1]
    assert attention.num_heads == 2 and attention.table.shape == (2, 9) and not attention.cache


def test_a_value_cached_before_slimming_is_a_constant_that_keeps_its_heads_never_a_stale_width() -> None:
    model, x = _biased(warm=True)
    prunereg.slim(model, x, ratio=0.5, importance=First())
    attention = model[1]
    assert attention.num_heads == 4 and attention.table.shape == (4, 9)  # the cached biases hold all four heads
    got = outputs(model, (x,))
    attention.cache.clear()
    torch.testing.assert_close(outputs(model, (x,)), got, rtol=0, atol=0)


def test_heads_masked_with_their_rows_of_a_cached_table_go_and_the_outputs_are_the_masked_models() -> None:
    model, x = _biased()
    attention = model[1]
    heads = torch.zeros(48)
    heads[HEADS_KEPT] = 1
    prunereg.get("custom_from_mask").apply(attention.qkv, "weight", mask=heads[:, None].expand(48, 16).clone())
    prunereg.get("custom_from_mask").apply(attention.qkv, "bias", mask=heads.clone())
    expected = outputs(model, (x,))
    attention.cache.clear()
    prunereg.slim(model, x)
    assert attention.num_heads == 2 and attention.table.shape == (2, 9)
    torch.testing.assert_close(outputs(model, (x,)), expected, rtol=1e-5, atol=1e-6)
