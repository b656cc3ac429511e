"""prunereg.testing.check_recovery_method: the built-ins pass, and each broken contract is caught and named."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import prunereg
from prunereg import RecoveryBlock, RecoveryMethod, RecoveryModel
from prunereg.testing import check_recovery_method


@pytest.mark.parametrize(
    ("name", "options"),
    [("refit", {}), ("refit", {"writers": "mlp", "ridge": 0.0}), ("replace", {}), ("blockwise", {"epochs": 2}),
     ("blockwise", {"epochs": 2, "dense_inputs": True}), ("distill", {"max_tokens": 32})],
)  # fmt: skip
def test_the_built_in_methods_keep_the_contract(name: str, options: dict) -> None:  # type: ignore[type-arg]
    check_recovery_method(name, **options)
    check_recovery_method(prunereg.get(name), **options)


class _Widens(RecoveryMethod):
    def recover_block(self, block: RecoveryBlock) -> str | None:
        block.module.mlp.down_proj.weight.data = torch.zeros(16, 30)
        return None


class _FillsZeros(RecoveryMethod):
    def recover_block(self, block: RecoveryBlock) -> str | None:
        with torch.no_grad():
            block.module.mlp.up_proj.weight.fill_(0.5)
        return None


class _Random(RecoveryMethod):
    """A refit whose damping depends on the clock: a better block each time, never the same one."""

    def recover_block(self, block: RecoveryBlock) -> str | None:
        ridge = (time.perf_counter_ns() % 997 + 1) / 1000
        return prunereg.get("refit")(writers="mlp", ridge=ridge).recover_block(block)


class _Says(RecoveryMethod):
    def recover_block(self, block: RecoveryBlock) -> str | None:
        return 3  # type: ignore[return-value]


class _Embeds(RecoveryMethod):
    SCOPE = "model"

    def recover_model(self, model: RecoveryModel) -> str | None:
        with torch.no_grad():
            model.student.get_input_embeddings().weight.mul_(2)
        return None


class _WrongBias(RecoveryMethod):
    @property
    def writer_biases(self) -> frozenset[str]:
        return frozenset({"router"})


class _VagueAttention(RecoveryMethod):
    def reads_attention_residual(self, changed: frozenset[str]) -> bool:
        return "attention" if changed else False  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("method", "message"),
    [
        (_Widens, "changed mlp.down_proj.weight from .* a recovery method keeps every shape"),
        (_FillsZeros, "recovering a pruned block on cpu: .*set pruned weights of mlp.up_proj.weight"),
        (_Random, "differs between two runs from the same start and seed"),
        (_Says, "returned int, not a note"),
        (_Embeds, "an input embedding or the output head"),
        (_WrongBias, "writer_biases names unknown kinds: router"),
        (_VagueAttention, r"reads_attention_residual\(changed=\['attention'\]\) gave 'attention', not a bool"),
        (nn.Linear, "not a prunereg.RecoveryMethod subclass"),
    ],
)
def test_a_broken_contract_is_caught_and_named(method: type, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_recovery_method(method, devices=["cpu"])


def test_a_name_of_another_kind_is_refused() -> None:
    with pytest.raises(AssertionError, match="registered as kind 'calibrated', not 'recovery'"):
        check_recovery_method("wanda")


def test_a_class_must_say_a_known_scope_and_statistics() -> None:
    with pytest.raises(TypeError, match="SCOPE must be one of block, model"):
        type("Bad", (RecoveryMethod,), {"SCOPE": "layer"})
    with pytest.raises(TypeError, match="STATISTICS names unknown entries: hessian"):
        type("Bad", (RecoveryMethod,), {"STATISTICS": frozenset({"hessian"})})
