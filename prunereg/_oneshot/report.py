"""What :func:`prunereg.oneshot` did: every pruned layer's sparsity, and where the time went."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class LayerReport:
    """One pruned layer: its name in the model, weight shape ``[out, in]``, target and reached sparsity."""

    name: str
    shape: tuple[int, int]
    target: float
    sparsity: float


@dataclass
class Timings:
    """Seconds spent, by phase.

    ``capture``: running the calibration set up to the first block; ``forward``:
    the blocks' calibration forwards (statistics passes and the re-runs that feed
    the next block), hooks excluded; ``statistics``: accumulating norms and
    Hessians in the hooks; ``pruning``: the method's selection and weight update;
    ``outlier_pass``: OWL's first pass (all its phases together); ``loading``:
    reading and writing weights when streaming; ``total``: the whole call.
    """

    capture: float = 0.0
    forward: float = 0.0
    statistics: float = 0.0
    pruning: float = 0.0
    outlier_pass: float = 0.0
    loading: float = 0.0
    total: float = 0.0

    def __str__(self) -> str:
        """One line in seconds, one decimal: what a person reads (the attributes keep every digit)."""
        return (
            f"{self.total:.1f} s: capture {self.capture:.1f}, forwards {self.forward:.1f}, "
            f"statistics {self.statistics:.1f}, pruning {self.pruning:.1f}, "
            f"outlier pass {self.outlier_pass:.1f}, loading {self.loading:.1f}"
        )


@dataclass
class OneShotReport:
    """The result of :func:`prunereg.oneshot`: per-layer sparsity, per-block targets and timings.

    ``layers`` lists every pruned layer; ``block_sparsities`` each block's target
    (OWL's, with ``outlier_ratios``, or the uniform one); ``unpruned`` the layers
    no calibration input reached, left dense.
    """

    method: str
    sparsity: float
    pattern: str | None
    allocation: str
    n_tokens: int
    permanent: bool
    matmul_precision: str = "highest"
    """torch's float32 matmul precision of the calibration forwards."""
    layers: list[LayerReport] = field(default_factory=list)
    block_sparsities: list[float] = field(default_factory=list)
    outlier_ratios: list[float] | None = None
    unpruned: list[str] = field(default_factory=list)
    """Selected layers the calibration forward never called (left dense)."""
    timings: Timings = field(default_factory=Timings)
    model: Any = field(default=None, repr=False, compare=False)
    """The pruned model when ``prunereg.oneshot`` loaded it from a folder path (None otherwise)."""

    @property
    def overall_sparsity(self) -> float:
        """The share of zeros over all pruned layers' weights together."""
        total = sum(layer.shape[0] * layer.shape[1] for layer in self.layers)
        zeros = sum(layer.sparsity * layer.shape[0] * layer.shape[1] for layer in self.layers)
        return zeros / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain data (lists, numbers, strings) for JSON, rounded for people.

        Shares (sparsities, targets, outlier ratios) keep 6 decimals, so float
        noise such as ``0.7799999999999999`` reads ``0.78``; seconds keep 3.
        The attributes themselves keep every digit.
        """
        data = asdict(replace(self, model=None))  # the model is not data (and asdict would copy it)
        del data["model"]
        for layer in data["layers"]:
            layer["target"], layer["sparsity"] = _share(layer["target"]), _share(layer["sparsity"])
        data["sparsity"] = _share(self.sparsity)
        data["block_sparsities"] = [_share(value) for value in self.block_sparsities]
        if self.outlier_ratios is not None:
            data["outlier_ratios"] = [_share(value) for value in self.outlier_ratios]
        data["timings"] = {phase: round(seconds, 3) for phase, seconds in data["timings"].items()}
        return {**data, "overall_sparsity": _share(self.overall_sparsity)}

    def __str__(self) -> str:
        shape = self.pattern if self.pattern is not None else f"{self.sparsity:.0%} ({self.allocation})"
        lines = [
            f"{self.method}: {len(self.layers)} layers in {len(self.block_sparsities)} blocks pruned to {shape}, "
            f"{self.overall_sparsity:.2%} zeros overall, "
            + (f"from {self.n_tokens} calibration tokens" if self.n_tokens else "without calibration data"),
        ]
        if len(set(self.block_sparsities)) > 1:  # OWL's targets differ by block: say which
            lines.append("block targets: " + ", ".join(f"{value:.1%}" for value in self.block_sparsities))
        lines.append(f"time {self.timings}")
        return "\n".join(lines)

    def table(self) -> str:
        """One line per pruned layer: name, shape, target and reached sparsity."""
        width = max((len(layer.name) for layer in self.layers), default=4)
        rows = [f"{'NAME':<{width}}  {'SHAPE':>12}  TARGET  SPARSITY"]
        for layer in self.layers:
            shape = f"{layer.shape[0]}x{layer.shape[1]}"
            rows.append(f"{layer.name:<{width}}  {shape:>12}  {layer.target:6.2%}  {layer.sparsity:8.2%}")
        return "\n".join(rows)


def _share(value: float) -> float:
    """A share from 0 to 1 to 6 decimals: below what any layer's entry count can tell, above float noise."""
    return round(value, 6)
