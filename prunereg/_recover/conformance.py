"""The conformance check for recovery methods, exported as ``prunereg.testing.check_recovery_method``.

The method runs through the engine's own step (:mod:`prunereg._recover.step`)
on a tiny pre-norm decoder block written here in plain torch (attention with
``q/k/v/o_proj``, a gated MLP with ``gate/up/down_proj``, RMS norms), so the
check needs no transformers: a dense teacher block, a student with half its
MLP channels cut, and a student with half of every weight pruned to zero.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from prunereg._recover.contract import SCOPES, STATISTIC_NAMES, WRITER_KINDS, RecoveryMethod
from prunereg._recover.data import RecoveryBlock, RecoveryModel, zero_masks
from prunereg._recover.parts import block_parts, changed_parts
from prunereg._recover.runtime import BlockInputs, default_devices, method_class
from prunereg._recover.step import recover_block, recover_model
from prunereg._recover.teacher import TeacherTrajectory

_SEED = 1234
_HIDDEN, _HEADS, _INTERMEDIATE, _VOCABULARY = 16, 2, 24, 32
_BATCHES, _SAMPLES, _TOKENS = 3, 2, 8
_CONFIG = SimpleNamespace(
    num_attention_heads=_HEADS, num_key_value_heads=_HEADS, hidden_size=_HIDDEN, mlp_bias=False, attention_bias=False
)


def check_recovery_method(method: str | type, /, *, devices: Sequence[str] | None = None, **kwargs: Any) -> None:
    """Check that a recovery method keeps the contract :func:`prunereg.recover` relies on.

    ``method`` is a registered name or a :class:`prunereg.RecoveryMethod`
    subclass; ``kwargs`` go to its constructor. Checked on each of ``devices``
    (default: cpu, and cuda when present), on a tiny decoder block (or, for a
    method of ``SCOPE = "model"``, a tiny language model) made narrower than its
    teacher, and on one with half of each weight pruned to zero:

    - the class: a ``RecoveryMethod`` of kind ``recovery`` (the registered kind,
      for a name), with a known ``SCOPE``, ``STATISTICS`` the engine gathers,
      ``writer_biases`` among ``"mlp"`` and ``"attention"``, and
      ``reads_attention_residual`` a bool for every set of changed parts;
    - the method returns a note (a str) or None, changes parameters' values
      only (no parameter added, removed, replaced, reshaped, cast or moved), and
      leaves every zero of the pruned block zero;
    - the same result from the same start, run twice (under the same seed).

    Raises ``AssertionError`` naming the method, the check and the device.
    """
    cls, label = _method_class(method)
    with _checking(label, "constructing it with the given keyword arguments"):
        instance = cls(**kwargs)
        unknown = set(instance.writer_biases) - WRITER_KINDS
        if unknown:
            raise AssertionError(f"writer_biases names unknown kinds: {', '.join(sorted(unknown))}")
        for changed in (frozenset(), *(frozenset({kind}) for kind in sorted(WRITER_KINDS)), WRITER_KINDS):
            answer = instance.reads_attention_residual(changed)
            if not isinstance(answer, bool):
                raise AssertionError(f"reads_attention_residual(changed={sorted(changed)}) gave {answer!r}, not a bool")
    for device in devices if devices is not None else default_devices():
        for pruned in (False, True):
            what = f"{'a pruned' if pruned else 'a narrowed'} {'model' if cls.SCOPE == 'model' else 'block'}"
            with _checking(label, f"recovering {what} on {device}"):
                first = _recovered(cls, kwargs, device, pruned=pruned)
                second = _recovered(cls, kwargs, device, pruned=pruned)
                for name, value in first.items():
                    if not torch.equal(value, second[name]):
                        raise AssertionError(f"{name} differs between two runs from the same start and seed")


def _method_class(method: str | type) -> tuple[type[RecoveryMethod], str]:
    cls, label = method_class(method, RecoveryMethod, "recovery method")
    if cls.SCOPE not in SCOPES:
        raise AssertionError(f"{label}: SCOPE must be one of {', '.join(SCOPES)}, not {cls.SCOPE!r}")
    if not set(cls.STATISTICS) <= STATISTIC_NAMES:
        raise AssertionError(f"{label}: STATISTICS must be a subset of {sorted(STATISTIC_NAMES)}")
    return cls, label


@contextlib.contextmanager
def _checking(label: str, what: str) -> Iterator[None]:
    """Turn any error into an AssertionError that names the method and what was being checked."""
    try:
        yield
    except AssertionError as error:
        raise AssertionError(f"{label}, {what}: {error}") from None
    except Exception as error:
        raise AssertionError(f"{label}, {what}: {type(error).__name__}: {error}") from error


def _recovered(cls: type[RecoveryMethod], kwargs: dict[str, Any], device: str, *, pruned: bool) -> dict[str, Tensor]:
    """Run a fresh instance of the method through the engine's step; the recovered parameters."""
    method = cls(**kwargs)
    torch.manual_seed(_SEED)
    teacher = _TinyLM().to(device).eval()
    student = copy.deepcopy(teacher)
    if pruned:
        _prune_half(student)
    else:
        _narrow_mlp(student.block)
    generator = torch.Generator().manual_seed(_SEED)
    batches = [torch.randint(0, _VOCABULARY, (_SAMPLES, _TOKENS), generator=generator).to(device)] * _BATCHES
    with torch.no_grad():
        if cls.SCOPE == "model":
            model = RecoveryModel(student, teacher, batches, _masks(student), seed=_SEED)
            recover_model(method, model)
        else:
            recover_block(method, _block_data(student, teacher, batches, method))
    return {name: parameter.detach().clone() for name, parameter in student.named_parameters()}


def _masks(model: nn.Module) -> dict[str, Tensor]:
    return {name: kept for name, kept in zero_masks(model).items() if not name.startswith("embed.")}


def _block_data(student: _TinyLM, teacher: _TinyLM, batches: list[Tensor], method: RecoveryMethod) -> RecoveryBlock:
    """The student's block with the teacher block's outputs as targets, as the engine hands it to a method."""
    inputs = BlockInputs([student.embed(ids) for ids in batches], [()] * len(batches), [{}] * len(batches))
    trajectory = TeacherTrajectory(
        nn.ModuleList([teacher.block]),
        BlockInputs([teacher.embed(ids) for ids in batches], [()] * len(batches), [{}] * len(batches)),
    )
    dense_inputs = trajectory.next_inputs() if method.reads_dense_inputs else None
    parts = block_parts(student.block, _CONFIG)
    changed = changed_parts(parts, student.block, teacher.block)
    targets, attention = trajectory.run((0,), attention=method.reads_attention_residual(changed))
    return RecoveryBlock(
        student.block, 0, (0,), inputs, targets, writers=parts.writers, mlp=parts.mlp,
        changed=changed, attention_targets=attention,
        masks=zero_masks(student.block), seed=_SEED, dense_inputs=dense_inputs,
    )  # fmt: skip


def _narrow_mlp(block: _TinyBlock) -> None:
    """Keep the first half of the MLP's channels (gate and up rows, down columns)."""
    keep = _INTERMEDIATE // 2
    mlp = block.mlp
    for name in ("gate_proj", "up_proj"):
        old = getattr(mlp, name)
        setattr(mlp, name, _linear(old.weight[:keep]))
    mlp.down_proj = _linear(mlp.down_proj.weight[:, :keep])


def _prune_half(model: _TinyLM) -> None:
    """Zero the half of each Linear's weights in the block with the smallest magnitude."""
    with torch.no_grad():
        for module in model.block.modules():
            if isinstance(module, nn.Linear):
                weight = module.weight
                threshold = weight.abs().flatten().kthvalue(weight.numel() // 2).values
                weight.mul_(weight.abs() > threshold)


def _linear(weight: Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device)
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


class _RMSNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(_HIDDEN))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * self.weight


class _Attention(nn.Module):
    head_dim = _HIDDEN // _HEADS

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(_HIDDEN, _HIDDEN, bias=False) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        batch, tokens, _ = x.shape

        def heads(t: Tensor) -> Tensor:
            return t.reshape(batch, tokens, _HEADS, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(attended.transpose(1, 2).reshape(batch, tokens, _HIDDEN))


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(_HIDDEN, _INTERMEDIATE, bias=False)
        self.up_proj = nn.Linear(_HIDDEN, _INTERMEDIATE, bias=False)
        self.down_proj = nn.Linear(_INTERMEDIATE, _HIDDEN, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _TinyBlock(nn.Module):
    """A pre-norm decoder block as Llama's: attention then a gated MLP, each added to the residual stream."""

    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = _RMSNorm(), _RMSNorm()
        self.self_attn, self.mlp = _Attention(), _MLP()

    def forward(self, hidden: Tensor) -> Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class _TinyLM(nn.Module):
    """An embedding, one block and a head: the smallest causal language model a whole-model method can train."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(_VOCABULARY, _HIDDEN)
        self.block = _TinyBlock()
        self.head = nn.Linear(_HIDDEN, _VOCABULARY, bias=False)

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.block(self.embed(ids)))
