"""A conformance kit for pruning methods, for plugin authors and prunereg's own tests.

Opt-in: nothing here is registered as a pytest plugin; import it in a test::

    from prunereg.testing import check_pruning_method

    def test_my_method_follows_the_contract():
        check_pruning_method("my_method", amount=0.3)

:func:`check_pruning_method` raises ``AssertionError`` naming the method, the
check, the device and the dtype at the first violation of the contract.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

import prunereg
from prunereg._oneshot.conformance import check_calibrated_method
from prunereg._plugins.kinds import kind_names
from prunereg._plugins.registry import constructor_parameters
from prunereg._recover.conformance import check_recovery_method
from prunereg._shrink.conformance import check_shrink_method
from prunereg._slim.conformance import check_importance
from prunereg._slim.conformance import step as _step

__all__ = [
    "check_calibrated_method",
    "check_importance",
    "check_pruning_method",
    "check_recovery_method",
    "check_shrink_method",
]

DEFAULT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_SEED = 1234


def check_pruning_method(
    method: str | type,
    /,
    *,
    tensor_shape: Sequence[int] = (8, 12),
    devices: Sequence[str] | None = None,
    dtypes: Sequence[torch.dtype] = DEFAULT_DTYPES,
    exact_amount: bool = True,
    **kwargs: Any,
) -> None:
    """Check that a pruning method keeps the contract every method must keep.

    ``method`` is a registered name (``"l1_unstructured"``, ``"plugin:name"``) or
    a :class:`prunereg.BasePruningMethod` subclass; ``kwargs`` are passed to its
    constructor (and to ``apply``). Tensors have ``tensor_shape`` (pass a mask
    of that shape to a method that takes one). Checked, on every one of
    ``devices`` (default: cpu, meta, and cuda when present) and ``dtypes``:

    - the class: a ``BasePruningMethod`` with a known ``PRUNING_TYPE`` (the
      registered kind, for a name) and, if structured, a ``dim``;
    - ``compute_mask(t, default_mask)``: a tensor of ``t``'s shape, device and
      dtype, holding only 0 and 1, zero wherever ``default_mask`` is, leaving
      ``t`` and ``default_mask`` unchanged, and the same mask for the same seed;
    - ``amount``, when the constructor takes one: 0 prunes nothing, 1.0 prunes
      everything, an invalid amount raises ``ValueError`` (out of range) or
      ``TypeError`` (not a number); with ``exact_amount`` (torch's rule) a
      fraction ``a`` prunes exactly ``round(a * n)`` entries (structured: whole
      channels along ``dim``), without it more amount never prunes less (for
      methods that apply the amount per row or per group);
    - ``apply`` / a second ``apply`` (a ``PruningContainer``) / ``deepcopy`` /
      ``prunereg.remove``: the reparametrization round trip on every device,
      the installed mask having the parameter's own shape (not one that
      merely broadcasts, like ``(1, n)``) and device (not meta for a real one).
    """
    cls, label = _method_class(method)
    checker = _Checker(cls, label, tuple(tensor_shape), kwargs)
    with _step(label, "constructing it with the given keyword arguments"):
        instance = cls(**kwargs)
    if cls.PRUNING_TYPE == "structured" and not isinstance(getattr(instance, "dim", None), int):
        raise AssertionError(f"{label}: a structured method needs an integer attribute 'dim'")
    for device in devices if devices is not None else _default_devices():
        for dtype in dtypes:
            checker.check_masks(device, dtype)
        checker.check_round_trip(device)
    if "amount" in (constructor_parameters(cls) or {}):
        checker.check_amount(exact_amount)


def _method_class(method: str | type) -> tuple[type[prunereg.BasePruningMethod], str]:
    if isinstance(method, str):
        with _step(repr(method), "looking it up in the registry"):
            cls = prunereg.get(method)
            info = prunereg.info(method)
        if not info.summary.strip():
            raise AssertionError(f"{method!r}: registered with an empty summary")
        return cls, f"{method!r} ({cls.__module__}.{cls.__qualname__})"
    label = getattr(method, "__qualname__", repr(method))
    if not (isinstance(method, type) and issubclass(method, prunereg.BasePruningMethod)):
        raise AssertionError(f"{label}: not a prunereg.BasePruningMethod subclass")
    kind = getattr(method, "PRUNING_TYPE", None)
    if kind not in kind_names(masks=True):
        raise AssertionError(f"{label}: PRUNING_TYPE must be one of {', '.join(kind_names(masks=True))}, not {kind!r}")
    return method, label


def _default_devices() -> list[str]:
    return ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else [])


@contextlib.contextmanager
def _seeded(device: str) -> Iterator[None]:
    """Seed torch's generators for a block, leaving the caller's random state as it was."""
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if device == "cuda" else []):
        torch.manual_seed(_SEED)
        yield


class _Holder(nn.Module):
    """The smallest module with a prunable parameter of any shape."""

    # What pruning adds, declared for type checkers (nn.Module's __getattr__ is untyped).
    weight_orig: nn.Parameter
    weight_mask: torch.Tensor

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class _Checker:
    def __init__(
        self, cls: type[prunereg.BasePruningMethod], label: str, shape: tuple[int, ...], kwargs: dict[str, Any]
    ) -> None:
        self.cls, self.label, self.shape, self.kwargs = cls, label, shape, kwargs

    # -- tensors -------------------------------------------------------------------

    def tensor(self, device: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Distinct values of both signs (no ties at any threshold)."""
        n = _numel(self.shape)
        values = torch.randperm(n, generator=torch.Generator().manual_seed(0)).to(torch.float64)
        return ((values - n / 2 + 0.5) / n).reshape(self.shape).to(device=device, dtype=dtype)

    def partial_mask(self, device: str, dtype: torch.dtype) -> torch.Tensor:
        """A default mask with about a third of its entries already pruned."""
        drawn = torch.rand(self.shape, generator=torch.Generator().manual_seed(1))
        return (drawn > 1 / 3).to(device=device, dtype=dtype)

    def mask(self, t: torch.Tensor, default_mask: torch.Tensor, what: str, **overrides: Any) -> torch.Tensor:
        with _step(self.label, what), _seeded(t.device.type):
            return self.cls(**{**self.kwargs, **overrides}).compute_mask(t, default_mask)

    def fail(self, message: str, device: str | None = None, dtype: torch.dtype | None = None) -> None:
        where = ", ".join(p for p in (device and f"device {device}", dtype and f"dtype {dtype}") if p)
        raise AssertionError(f"{self.label}: {message}" + (f" ({where})" if where else ""))

    # -- checks --------------------------------------------------------------------

    def check_masks(self, device: str, dtype: torch.dtype) -> None:
        """Shape, device, dtype, values, default_mask, inputs untouched, determinism."""
        t = self.tensor(device, dtype)
        for default_mask in (torch.ones_like(t), self.partial_mask(device, dtype)):
            t_before, default_before = t.clone(), default_mask.clone()
            what = f"computing a mask on {device} in {dtype}"
            mask = self.mask(t, default_mask, what)
            if not isinstance(mask, torch.Tensor):
                self.fail(f"compute_mask returned {type(mask).__name__}, not a tensor", device, dtype)
            if mask.shape != t.shape:
                self.fail(f"compute_mask returned shape {tuple(mask.shape)}, expected {tuple(t.shape)}", device, dtype)
            if mask.device != t.device:
                self.fail(f"compute_mask returned a mask on {mask.device}, expected {t.device}", device, dtype)
            if mask.dtype != default_mask.dtype:
                self.fail(
                    f"compute_mask returned dtype {mask.dtype}, expected {default_mask.dtype} (default_mask's)",
                    device,
                    dtype,
                )
            if device == "meta":
                continue
            if not bool(((mask == 0) | (mask == 1)).all()):
                self.fail("compute_mask returned values other than 0 and 1", device, dtype)
            if bool((mask[default_mask == 0] != 0).any()):
                self.fail("the mask keeps entries that default_mask had already pruned", device, dtype)
            if not (torch.equal(t, t_before) and torch.equal(default_mask, default_before)):
                self.fail("compute_mask modified its input tensor or default_mask in place", device, dtype)
            if not torch.equal(mask, self.mask(t, default_mask, what)):
                self.fail("the same seed gave a different mask", device, dtype)

    def check_amount(self, exact: bool) -> None:
        """0 prunes nothing, 1.0 everything, in between as many as asked; bad amounts raise."""
        t = self.tensor("cpu")
        ones = torch.ones_like(t)
        pruned = []
        for amount in (0.0, 0.25, 0.5, 0.75, 1.0):
            mask = self.mask(t, ones, f"computing a mask with amount={amount}", amount=amount)
            count, total = self._pruned_units(mask)
            if amount == 0.0 and count:
                self.fail(f"amount=0.0 pruned {count} of {total}, expected nothing")
            if amount == 1.0 and bool(mask.any()):
                self.fail(f"amount=1.0 kept {int(mask.count_nonzero())} entries, expected none")
            if exact and count != round(amount * total):
                self.fail(
                    f"amount={amount} pruned {count} of {total}, "
                    f"expected round(amount * {total}) = {round(amount * total)}"
                )
            pruned.append(count)
        if pruned != sorted(pruned):
            self.fail(f"more amount pruned less: amounts 0, .25, .5, .75, 1 pruned {pruned}")
        for bad, error_type in ((-0.5, ValueError), (1.5, ValueError), ("half", TypeError)):
            try:
                self.cls(**{**self.kwargs, "amount": bad}).compute_mask(t, ones)
            except error_type:
                continue
            except Exception as error:
                self.fail(f"amount={bad!r} raised {type(error).__name__}, expected {error_type.__name__}")
            self.fail(f"amount={bad!r} was accepted, expected {error_type.__name__}")

    def _pruned_units(self, mask: torch.Tensor) -> tuple[int, int]:
        """How many entries (or, structured, whole channels along dim) the mask prunes, of how many."""
        if self.cls.PRUNING_TYPE != "structured":
            return int((mask == 0).sum()), mask.numel()
        dim: int = getattr(self.cls(**self.kwargs), "dim")  # noqa: B009  (structured methods have it: checked first)
        rows = mask.movedim(dim, 0).reshape(mask.shape[dim], -1) != 0
        if not bool((rows.all(dim=1) | ~rows.any(dim=1)).all()):
            self.fail(f"a structured mask must keep or prune whole channels along dim={dim}")
        return int((~rows.any(dim=1)).sum()), mask.shape[dim]

    def check_round_trip(self, device: str) -> None:
        """apply, a second apply into a PruningContainer, deepcopy, remove."""
        values = device != "meta"
        module = _Holder(self.tensor(device))
        original = module.weight
        with _step(self.label, f"applying it to a module on {device}"), _seeded(device):
            hook = self.cls.apply(module, "weight", **self.kwargs)
        expected = self.mask(original, torch.ones_like(original), f"computing a mask on {device}")
        if not isinstance(hook, self.cls):
            self.fail(f"apply returned {type(hook).__name__}, expected the method itself", device)
        self._check_pruned(module, original, device)
        if values and not torch.equal(module.weight_mask, expected):
            self.fail("apply installed a mask other than compute_mask's for the same seed", device)
        first_mask = module.weight_mask.clone()
        with _step(self.label, f"applying it a second time on {device}"), _seeded(device):
            self.cls.apply(module, "weight", **self.kwargs)
        container = self._check_pruned(module, original, device)
        if not (isinstance(container, prunereg.PruningContainer) and len(container) == 2):
            self.fail("a second apply must leave one PruningContainer holding both methods", device)
        if values and bool((module.weight_mask[first_mask == 0] != 0).any()):
            self.fail("a second apply brought back entries the first one had pruned", device)
        with _step(self.label, f"running forward and deepcopy on {device}"):
            module(torch.ones(self.shape, device=device))
            copied = copy.deepcopy(module)
        if values and not torch.equal(copied.weight, module.weight):
            self.fail("deepcopy of the pruned module holds other values", device)
        final = module.weight.detach().clone()
        with _step(self.label, f"removing the pruning on {device}"):
            prunereg.remove(module, "weight")
        if module.weight is not original or set(module.state_dict()) != {"weight"} or module._forward_pre_hooks:
            self.fail("remove must leave the original Parameter as 'weight' and no mask, orig or hook", device)
        if values and not torch.equal(module.weight.detach(), final):
            self.fail("after remove the parameter does not hold the pruned values", device)

    def _check_pruned(self, module: _Holder, original: nn.Parameter, device: str) -> Any:
        hooks = [h for h in module._forward_pre_hooks.values() if isinstance(h, prunereg.BasePruningMethod)]
        if len(hooks) != 1:
            self.fail(f"a pruned tensor must have exactly one pruning hook, found {len(hooks)}", device)
        mask = module.weight_mask
        if mask.shape != original.shape:
            # A (1, n) mask broadcasts in orig * mask and looks fine until a state dict or a container meets it.
            self.fail(
                f"apply installed a mask of shape {tuple(mask.shape)} for a parameter of shape "
                f"{tuple(original.shape)}; a mask must have the parameter's shape, not one that broadcasts",
                device,
            )
        if mask.device != original.device:
            self.fail(f"apply installed a mask on {mask.device} for a parameter on {original.device}", device)
        if module.weight_orig is not original or set(module.state_dict()) != {"weight_orig", "weight_mask"}:
            self.fail("apply must move the Parameter itself to weight_orig and add the buffer weight_mask", device)
        if device != "meta" and not torch.equal(module.weight, original * module.weight_mask):
            self.fail("module.weight is not weight_orig * weight_mask after apply", device)
        return hooks[0]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n
