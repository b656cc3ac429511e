"""What slimming says when it cannot do as asked, or would do nothing: one line that names the module, the attribute
or the argument, nothing from torch before it, and the model bitwise as it was."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunereg
from tests.slim.helpers import (
    DataDependentBranch,
    assert_bitwise_equal,
    assert_unchanged,
    bitwise,
    exact_state,
    outputs,
)


class Mixer(nn.Module):
    """Attention that reads its head count and width from attributes slimming does not know of."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.width = 4, 8
        self.to_qkv, self.proj = nn.Linear(8, 24), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (
            part.view(b, t, self.num_heads, self.width // self.num_heads).transpose(1, 2)
            for part in self.to_qkv(x).chunk(3, dim=-1)
        )
        mixed = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
        return self.proj(mixed.reshape(b, t, self.width))


class WithMixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.mixer, self.head = nn.Linear(6, 8), Mixer(), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mixer(self.embed(x)))


def test_a_module_reading_its_width_is_kept_whole_by_a_ratio_and_named_with_the_attributes_and_the_way_around() -> None:
    torch.manual_seed(0)
    model, x = WithMixer(), torch.randn(1, 5, 6)
    dense = outputs(model, (x,))
    with pytest.warns(UserWarning) as warned:
        report = prunereg.slim(model, x, ratio=0.5)
    kept = next(str(w.message) for w in warned if "kept 'mixer' whole" in str(w.message))
    assert "\n" not in kept and "the slimmed model fails on the example inputs (RuntimeError: " in kept
    assert "'mixer' reads self.width (8), a width slimming changed but cannot set there" in kept
    assert kept.endswith("prunereg.register_width_rule(Mixer, ...) can say how it slims")
    assert kept in report.notes
    # the module whole, and what only feeds it or reads it: its heads were not cut behind its back
    assert model.mixer.to_qkv.weight.shape == (24, 8) and model.mixer.num_heads == 4 and report.removed == 0
    torch.testing.assert_close(outputs(model, (x,)), dense, rtol=0, atol=0)


def test_a_module_reading_its_width_is_named_when_the_masks_plan_the_cut_and_the_model_stays_as_it_was() -> None:
    torch.manual_seed(0)
    model, x = WithMixer(), torch.randn(1, 5, 6)
    head = torch.ones(24, 8)
    head[[0, 1, 8, 9, 16, 17]] = 0  # head 0 of the queries, keys and values
    prunereg.get("custom_from_mask").apply(model.mixer.to_qkv, "weight", mask=head)
    prunereg.get("custom_from_mask").apply(model.mixer.to_qkv, "bias", mask=head[:, 0].clone())
    before, state = exact_state(model), bitwise(model)
    with pytest.raises(prunereg.SlimError) as refused:
        prunereg.slim(model, x)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("the slimmed model fails on the example inputs (RuntimeError: ")
    assert message.endswith(
        "'mixer' reads self.width (8), a width slimming changed but cannot set there: pass ignore=['mixer'] to keep "
        "that module whole"
    )
    assert_unchanged(model, before)
    assert_bitwise_equal(model, state)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _torch_levels() -> dict[str, int]:
    loggers = logging.root.manager.loggerDict.items()
    return {name: logger.level for name, logger in loggers if isinstance(logger, logging.Logger)}


def test_a_model_export_cannot_trace_is_one_line_with_nothing_from_torch_before_it(
    capfd: pytest.CaptureFixture[str],
) -> None:
    model, x = DataDependentBranch(), torch.randn(2, 4)
    state, levels = bitwise(model), _torch_levels()
    records, torch_logger = _Records(), logging.getLogger("torch")
    torch_logger.addHandler(records)
    try:
        with pytest.raises(prunereg.SlimError, match=r"^cannot build the graph of DataDependentBranch with torch\."):
            prunereg.slim(model, x, ratio=0.5)
    finally:
        torch_logger.removeHandler(records)
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""  # torch printed its partial graph here, some 20 lines
    assert [r for r in records.records if r.levelno >= logging.INFO] == []  # and logged "Unable to find user code"
    after = _torch_levels()
    assert {name: after[name] for name in levels} == levels  # torch's logging as it was (export may add loggers)
    assert logging.getLogger("torch.fx.experimental.symbolic_shapes").isEnabledFor(logging.WARNING)
    assert_bitwise_equal(model, state)


class Bottleneck(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.up, self.down, self.head = nn.Linear(5, 8), nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        return self.head(h + self.down(torch.relu(self.up(h))))


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ({"ratio": 0.5, "round_to": 10**6}, "round_to=1000000 keeps every group whole: the largest has 16 units"),
        ({"ratio": 0.03}, "ratio 0.03 of a group rounds to no unit (the largest group has 16)"),
        ({"ratio": 0.5, "ignore": ["embed", "up"]},
         "every channel is kept whole (an ignored module, a model input or output, an operation not followed)"),
        ({}, "no channel is pruned whole (its rows or filters at zero in every layer that makes it); pass ratio= "
             "(say ratio=0.3) to remove that share of every group's channels, the lowest by importance"),
    ],
    ids=["round_to beyond every group", "ratio below one unit", "everything ignored", "no masks"],
)  # fmt: skip
def test_slimming_that_removes_nothing_warns_why_and_leaves_the_model_bitwise_as_it_was(
    arguments: dict[str, Any], why: str
) -> None:
    torch.manual_seed(0)
    model, x = Bottleneck(), torch.randn(2, 5)
    state = bitwise(model)
    with pytest.warns(UserWarning, match=f"^slimming removed nothing: {re.escape(why)}"):
        report = prunereg.slim(model, x, **arguments)
    assert report.removed == 0 and report.notes == [f"slimming removed nothing: {why}"]
    assert f"note: slimming removed nothing: {why}" in str(report)
    assert_bitwise_equal(model, state)


def test_ratio_zero_asks_for_nothing_and_gets_no_warning(recwarn: pytest.WarningsRecorder) -> None:
    assert prunereg.slim(Bottleneck(), torch.randn(2, 5), ratio=0.0).removed == 0
    assert not [w for w in recwarn if "removed nothing" in str(w.message)]


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"ignore": "embed"}, TypeError, r"^ignore must be a list of modules or module names, not a str: pass "
         r"ignore=\['embed'\]$"),
        ({"ignore": ""}, TypeError, r"not a str: pass ignore=\[''\]"),
        ({"ignore": [""]}, ValueError, r"^ignore='' names the root module, and ignoring the root ignores everything"),
        ({"ignore": [3]}, TypeError, r"^ignore holds modules or module names, not int$"),
        ({"ignore": 3}, TypeError, r"^ignore must be a list of modules or module names, not a int"),
        ({"importance": "taylor"}, ValueError, r"^importance='taylor' applies to a ratio; without ratio the masks"),
        ({"round_to": 4}, ValueError, r"^round_to=4 applies to a ratio; without ratio the masks choose the channels"),
    ],
    ids=["ignore a str", "ignore an empty str", "ignore the root", "ignore an int", "ignore not a list",
         "importance without ratio", "round_to without ratio"],
)  # fmt: skip
def test_arguments_that_would_be_misread_or_change_nothing_are_refused_with_the_model_unchanged(
    arguments: dict[str, Any], error: type[Exception], message: str
) -> None:
    model, x = Bottleneck(), torch.randn(2, 5)
    before, state = exact_state(model), bitwise(model)
    with pytest.raises(error, match=message):
        prunereg.slim(model, x, **arguments)
    assert_unchanged(model, before)
    assert_bitwise_equal(model, state)


def test_the_model_itself_in_ignore_is_the_root_and_refused() -> None:
    model = Bottleneck()
    state = bitwise(model)
    with pytest.raises(ValueError, match=r"^ignore holds the model itself, the root module, and ignoring the root"):
        prunereg.slim(model, torch.randn(2, 5), ratio=0.5, ignore=[model])
    assert_bitwise_equal(model, state)
