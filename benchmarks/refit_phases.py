"""Where ``refit``'s time goes in shrinking's pass: CPU-seconds per phase, beside the shrink alone.

    python benchmarks/refit_phases.py            # SmolLM2-135M, FLAP at mlp 0.5 and heads 1/3 (about 6 minutes)
    python benchmarks/refit_phases.py --quick    # a tiny Llama from a config: a smoke test

docs/shrinking.md's table of refit's time comes from here. One thread,
CPU-seconds (``time.process_time``), so that a shared machine's load moves the
figures less. After a warm-up on two samples (the one-time costs of a
process's first call fall on no row), per setting a copy of the model is
shrunk alone, then the model with ``recover="refit"``; in that run each phase
is timed by wrapping the function that does it where prunereg calls it (a
renamed step fails loudly here). Columns: the shrink alone; refit's extra (the run with refit less the
shrink alone, and their ratio); the statistics' passes over each cut block on
the recovered trajectory, less the normal equations folded in them (the
forward, and each pass's loss); the normal equations; the rest of the extra
(the writers' checks, the solves, the replays of the refit writers, the
copies kept for ``restore_on_error``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import functools
import importlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PHASES = (
    ("prunereg._recover.data", "RecoveryBlock", "normal_equations", "passes"),
    ("prunereg._runtime.least_squares", "LeastSquares", "fold", "normal equations"),
)
"""(module, class in it, method, label): the steps timed, inclusive of what they call."""

SETTINGS = {"mlp 0.5": {"mlp": 0.5}, "heads 1/3": {"heads": 1 / 3}}
"""The rows: FLAP's removal in each."""

HEADER = (
    "| FLAP | shrink alone | refit's extra | passes on the recovered trajectory, less the normal equations "
    "| normal equations | the rest |"
)


@contextlib.contextmanager
def timed_phases() -> Iterator[dict[str, float]]:
    """Within the block, each of :data:`PHASES` adds its CPU-seconds to the dict yielded, under its label."""
    totals: dict[str, float] = collections.defaultdict(float)
    originals = []
    for module_name, class_name, method, label in PHASES:
        owner = getattr(importlib.import_module(module_name), class_name)
        original = getattr(owner, method)
        originals.append((owner, method, original))

        def wrapper(*args: Any, _original: Any = original, _label: str = label, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return _original(*args, **kwargs)
            finally:
                totals[_label] += time.process_time() - start

        setattr(owner, method, functools.wraps(original)(wrapper))
    try:
        yield totals
    finally:
        for owner, method, original in originals:
            setattr(owner, method, original)


def measure(model: Any, calibration: Any, removes: dict[str, float]) -> dict[str, float]:
    """CPU-seconds of the shrink alone (on a copy), of the shrink with refit, and of each phase in the latter."""
    import prunereg

    alone = copy.deepcopy(model)
    start = time.process_time()
    prunereg.shrink(alone, "flap", calibration, progress=False, **removes)
    shrink = time.process_time() - start
    del alone
    with timed_phases() as phases:
        start = time.process_time()
        prunereg.shrink(model, "flap", calibration, recover="refit", progress=False, **removes)
        with_refit = time.process_time() - start
    return {"shrink": shrink, "with refit": with_refit, **phases}


def row(name: str, seconds: dict[str, float]) -> str:
    """One table row of :func:`measure`'s figures."""
    extra = seconds["with refit"] - seconds["shrink"]
    passes, equations = seconds["passes"], seconds["normal equations"]
    return (
        f"| {name} | {seconds['shrink']:.1f} | {extra:.1f} ({extra / seconds['shrink']:.2f}x) "
        f"| {passes - equations:.1f} | {equations:.1f} | {extra - passes:.1f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny Llama from a config")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if args.quick:
        import shrink

        model, calibration, _ = shrink.quick_data()
    else:
        import llm

        model, calibration, _ = llm.load(llm.cache_dir())
    import prunereg

    # What the first call in a process pays once (imports, first dispatches) is no setting's: paid here.
    prunereg.shrink(copy.deepcopy(model), "flap", calibration[:2], recover="refit", progress=False, mlp=0.5)
    print(HEADER)
    print("|---|---|---|---|---|---|")
    for name, removes in SETTINGS.items():
        print(row(name, measure(copy.deepcopy(model), calibration, removes)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
