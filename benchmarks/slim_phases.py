"""Where ``prunereg.slim``'s time goes: CPU-seconds per phase, per model, warm, and the first call apart.

    python benchmarks/slim_phases.py             # benchmarks/slim.py's models at full size (about 2 minutes)
    python benchmarks/slim_phases.py --quick     # tiny ones: a smoke test
    python benchmarks/slim_phases.py --models llama bert --rounds 5

Printed, not written into the docs: a profile for whoever makes slimming
faster. CPU-seconds (``time.process_time``, one thread), not wall time, so that
a shared machine's load moves the figures less. The first slimming call in a
process pays one-time starts (torch's dispatch modes; ``torch.export``'s tracer
where a model goes through it); it is measured once, on the first model, and
then every model is slimmed ``--rounds`` times, interleaved, each time a fresh
copy, and the median of each phase is shown. A phase is one of slimming's
steps, timed by wrapping the function that does it where :mod:`prunereg._slim`
calls it (so a renamed step fails loudly here).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PHASES = (
    ("engine", "capture_model", "capture (plan)"),
    ("attempt", "capture_like", "capture (check)"),
    ("attempt", "build_graph", "graph"),
    ("attempt", "find_groups", "groups"),
    ("engine", "_lowest_units", "scores"),
    ("attempt", "cut", "cut"),
    ("attempt", "forward", "forward"),
    ("engine", "rewrite_config", "config"),
)
"""(module of prunereg._slim, function name there, label): the steps timed."""

MODELS = {
    "mlp": ("residual_mlp", False),
    "lenet": ("lenet", False),
    "unflatten": ("unflatten_into_transposed_conv", False),
    "cnn": ("concat_depthwise_residual_cnn", True),
    "resnet50": ("hf_resnet50", True),
    "bert": ("hf_bert", True),
    "llama": ("hf_smollm2_llama", True),
}
"""Name to (builder in tests/support/slim_models.py, whether it takes ``full``); the HF ones need transformers."""

QUICK = ("mlp", "lenet", "unflatten", "cnn")


@contextlib.contextmanager
def timed_phases(spent: collections.Counter[str]) -> Iterator[None]:
    """Add each phase's CPU-seconds to ``spent`` while inside; the functions are put back after."""
    from prunereg._slim import attempt, engine

    modules = {"attempt": attempt, "engine": engine}
    saved = [(modules[where], name, getattr(modules[where], name)) for where, name, _ in PHASES]
    for (module, name, function), (_, _, label) in zip(saved, PHASES, strict=True):
        setattr(module, name, _timing(function, label, spent))
    try:
        yield
    finally:
        for module, name, function in saved:
            setattr(module, name, function)


def _timing(function: Callable[..., Any], label: str, spent: collections.Counter[str]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent[label] += time.process_time() - start

    return timed


def build(name: str, quick: bool) -> tuple[Any, tuple[Any, ...]]:
    from tests.support import slim_models

    builder, sized = MODELS[name]
    make = getattr(slim_models, builder)
    return make(0, full=not quick) if sized else make(0)


def slim_once(model: Any, inputs: tuple[Any, ...], ratio: float) -> dict[str, float]:
    """Slim a copy of ``model``: its CPU-seconds per phase, with ``total`` and ``other`` (the rest)."""
    import prunereg

    spent: collections.Counter[str] = collections.Counter()
    copied = copy.deepcopy(model)
    with timed_phases(spent), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # modules kept whole warn; the time is what is read here
        start = time.process_time()
        prunereg.slim(copied, inputs, ratio=ratio)
        total = time.process_time() - start
    return {**spent, "total": total, "other": total - sum(spent.values())}


def table(medians: dict[str, dict[str, float]]) -> list[str]:
    labels = ["total", *(label for _, _, label in PHASES), "other"]
    rows = ["| model | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for name, phases in medians.items():
        rows.append(f"| {name} | " + " | ".join(f"{phases.get(label, 0.0):.3f}" for label in labels) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"tiny models ({', '.join(QUICK)} unless --models)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), help="these models (default: all, or --quick's)")
    parser.add_argument("--rounds", type=int, default=3, help="warm slimming calls per model, interleaved (median)")
    parser.add_argument("--ratio", type=float, default=0.5)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    import torch

    torch.set_num_threads(1)
    names = args.models or (list(QUICK) if args.quick else list(MODELS))
    built = {name: build(name, args.quick) for name in names}
    first = slim_once(*built[names[0]], args.ratio)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name in names:
            runs[name].append(slim_once(*built[name], args.ratio))
    labels = {label for by_model in runs.values() for run in by_model for label in run}
    medians = {
        name: {label: statistics.median(run.get(label, 0.0) for run in by_model) for label in labels}
        for name, by_model in runs.items()
    }
    print(
        f"CPU-seconds per slimming call at ratio {args.ratio:g}, one thread; warm: median of {args.rounds}, "
        f"interleaved. The first call in this process ({names[0]}): {first['total']:.3f} CPU-s, of which the "
        f"plan's capture {first.get('capture (plan)', 0.0):.3f} (warm: {medians[names[0]]['total']:.3f})."
    )
    print("\n".join(table(medians)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
