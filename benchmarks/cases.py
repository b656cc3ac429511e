"""The benchmark cases; ``python benchmarks/cases.py CASE LIB [--quick]`` runs one and prints its result.

Each case builds its inputs first. What is measured starts after that: wall time
and the peak resident memory above what the process holds once the inputs
exist (VmHWM, reset through /proc/self/clear_refs), in bytes.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import memory

LIBS = {"prunereg": "prunereg.prune", "torch": "torch.nn.utils.prune"}
BOTH = ("prunereg", "torch")
TOGETHER = ("together",)  # one run that measures both libraries side by side

# The 1B-parameter case needs about 2 GiB of weights and 2 GiB of masks, plus
# everything else on the machine: below this it is skipped, never attempted.
ONE_BILLION_NEEDS = 12 * memory.GIB


@dataclass(frozen=True)
class Case:
    name: str
    group: str
    title: str
    libs: tuple[str, ...]
    run: Callable[[str, bool], dict[str, Any]]


CASES: dict[str, Case] = {}


def case(name: str, group: str, title: str, libs: tuple[str, ...] = BOTH) -> Callable:
    def register(run: Callable[[str, bool], dict[str, Any]]) -> Callable:
        CASES[name] = Case(name, group, title, libs, run)
        return run

    return register


def measure(
    operation: Callable[[], object], *, weights: int, warmup: Callable[[], object] | None = None, repeat: bool = True
) -> dict[str, Any]:
    """Time ``operation`` (best of several runs if ``repeat``) and its peak memory above the inputs."""
    if warmup is not None:
        warmup()
    gc.collect()
    memory.trim()
    exact_peak = memory.reset_peak()
    baseline = memory.rss()
    times: list[float] = []
    started = time.perf_counter()
    while not times or (repeat and len(times) < 10 and (len(times) < 3 or time.perf_counter() - started < 2.0)):
        start = time.perf_counter()
        result = operation()
        times.append(time.perf_counter() - start)
        del result
    peak = memory.peak() - baseline
    gc.collect()
    memory.trim()
    return {
        "seconds": min(times),
        "median": statistics.median(times),
        "runs": len(times),
        "peak": peak,
        "exact_peak": exact_peak,
        "retained": memory.rss() - baseline,
        "weights": weights,
    }


def _prune_module(lib: str) -> Any:
    return importlib.import_module(LIBS[lib])


# compute_mask on one 4096 x 4096 tensor ----------------------------------------

_MASK_METHODS = {
    "l1_unstructured": lambda p: p.L1Unstructured(0.5),
    "random_unstructured": lambda p: p.RandomUnstructured(0.5),
    "ln_structured": lambda p: p.LnStructured(0.5, n=2, dim=0),
    "random_structured": lambda p: p.RandomStructured(0.5, dim=0),
}


def _compute_mask_case(method: str, dtype_name: str) -> Callable[[str, bool], dict[str, Any]]:
    def run(lib: str, quick: bool) -> dict[str, Any]:
        import torch

        side = 512 if quick else 4096
        torch.manual_seed(0)
        t = torch.randn(side, side).to(getattr(torch, dtype_name))
        default = torch.ones_like(t)
        pruning = _MASK_METHODS[method](_prune_module(lib))
        result = measure(
            lambda: pruning.compute_mask(t, default), weights=t.nbytes, warmup=lambda: pruning.compute_mask(t, default)
        )
        if method == "random_unstructured":
            # torch's masks need torch's draws: rand_like alone bounds any speedup.
            result["draws"] = measure(lambda: torch.rand_like(t), weights=t.nbytes)["seconds"]
        return {**result, "shape": list(t.shape)}

    return run


for _method in _MASK_METHODS:
    for _dtype in ("float32", "bfloat16"):
        case(f"compute_mask/{_method}/{_dtype}", "compute_mask", f"{_method} {_dtype}")(
            _compute_mask_case(_method, _dtype)
        )


# compute_mask beside a busy process ---------------------------------------------------


@contextlib.contextmanager
def busy_process() -> Any:
    """A process that keeps one core busy (``while True: pass``) for the duration of the block."""
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # running before the first timing
        yield process
    finally:
        process.kill()
        process.wait()


@case(
    "busy/l1_unstructured/float32",
    "busy",
    "l1_unstructured float32 4096 x 4096, alone and beside a busy process",
    libs=TOGETHER,
)
def busy(lib: str, quick: bool) -> dict[str, Any]:
    """Both libraries' compute_mask, interleaved, first on a quiet machine, then with one core taken."""
    import torch

    side = 1024 if quick else 4096
    torch.manual_seed(0)
    t = torch.randn(side, side)
    default = torch.ones_like(t)
    methods = {name: _prune_module(name).L1Unstructured(0.5) for name in BOTH}
    steps = {name: lambda m=m: m.compute_mask(t, default) for name, m in methods.items()}
    for step in steps.values():
        step()
    rounds = 3 if quick else 7
    result: dict[str, Any] = {"alone": _interleaved(steps, rounds)}
    with busy_process():
        result["busy"] = _interleaved(steps, rounds)
    return result | {"threads": torch.get_num_threads(), "cpus": os.cpu_count(), "shape": [side, side]}


# compute_mask against tensor size --------------------------------------------------

# Square tensors of 16 x 16 to 4096 x 4096 entries: where prunereg's selection overtakes torch's topk.
SIZE_SIDES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
QUICK_SIDES = (16, 64, 256)


def seconds_per_call(operation: Callable[[], object], *, batch_seconds: float = 0.02, budget: float = 1.0) -> float:
    """The best time of one call, timed over batches of calls lasting ``batch_seconds`` or more.

    A call on a small tensor takes microseconds, below the clock's resolution
    and the noise of one measurement, so calls are timed in batches.
    """
    operation()
    calls, elapsed = 1, 0.0
    while elapsed < batch_seconds:  # grow the batch until it lasts long enough to time
        calls *= 2
        start = time.perf_counter()
        for _ in range(calls):
            operation()
        elapsed = time.perf_counter() - start
    best, started = elapsed / calls, time.perf_counter()
    while time.perf_counter() - started < budget:
        start = time.perf_counter()
        for _ in range(calls):
            operation()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def _size_sweep(method: str, dtype_name: str) -> Callable[[str, bool], dict[str, Any]]:
    def run(lib: str, quick: bool) -> dict[str, Any]:
        import torch

        pruning = _MASK_METHODS[method](_prune_module(lib))
        points = []
        for side in QUICK_SIDES if quick else SIZE_SIDES:
            torch.manual_seed(0)
            t = torch.randn(side, side).to(getattr(torch, dtype_name))
            default = torch.ones_like(t)
            seconds = seconds_per_call(lambda t=t, default=default: pruning.compute_mask(t, default))
            points.append({"numel": t.numel(), "shape": [side, side], "seconds": seconds})
        return {"sizes": points}

    return run


for _dtype in ("float32", "bfloat16"):
    case(f"sizes/l1_unstructured/{_dtype}", "sizes", f"l1_unstructured {_dtype}")(
        _size_sweep("l1_unstructured", _dtype)
    )


# global_unstructured over stacks of Linear layers --------------------------------


def _mlp(layers: int, width: int, dtype: Any, bias: bool = True) -> Any:
    from torch import nn

    return nn.Sequential(*[nn.Linear(width, width, bias=bias, dtype=dtype) for _ in range(layers)])


def _global_case(
    layers: int,
    width: int,
    dtype_name: str,
    method: str = "L1Unstructured",
    compact: bool = False,
    quick_shape: tuple[int, int] = (4, 256),
) -> Callable:
    def run(lib: str, quick: bool) -> dict[str, Any]:
        import torch

        dtype = getattr(torch, dtype_name)
        n_layers, n_width = quick_shape if quick else (layers, width)
        torch.manual_seed(0)
        model = _mlp(n_layers, n_width, dtype, bias=False)
        prune = _prune_module(lib)
        pairs = [(m, "weight") for m in model]
        weights = sum(m.weight.nbytes for m in model)
        tiny = _mlp(2, 8, dtype)

        def operation() -> None:
            context = importlib.import_module("prunereg").compact_masks() if compact else contextlib.nullcontext()
            with context:
                prune.global_unstructured(pairs, getattr(prune, method), amount=0.5)

        warmup = lambda: prune.global_unstructured([(m, "weight") for m in tiny], getattr(prune, method), amount=0.5)  # noqa: E731
        result = measure(operation, weights=weights, warmup=warmup, repeat=False)
        masks = sum(m.weight_mask.nbytes for m in model)
        return {**result, "params": sum(m.weight.numel() for m in model), "mask_bytes": masks}

    return run


case("global/l1/50M/float32", "global", "12 x Linear(2048, 2048), L1, float32")(_global_case(12, 2048, "float32"))
case("global/random/50M/float32", "global", "12 x Linear(2048, 2048), random, float32")(
    _global_case(12, 2048, "float32", "RandomUnstructured")
)
case("global/l1/50M/bfloat16", "global", "12 x Linear(2048, 2048), L1, bfloat16")(_global_case(12, 2048, "bfloat16"))
case("global/l1/100M/float32", "global", "24 x Linear(2048, 2048), L1, float32")(
    _global_case(24, 2048, "float32", quick_shape=(8, 256))
)
case(
    "global/l1/50M/float32/compact",
    "compact",
    "12 x Linear(2048, 2048), L1, float32, compact masks",
    libs=("prunereg",),
)(_global_case(12, 2048, "float32", compact=True))


@case("global/l1/1B/bfloat16", "scale", "60 x Linear(4096, 4096), L1, bfloat16 (1.0B parameters)", libs=("prunereg",))
def one_billion(lib: str, quick: bool) -> dict[str, Any]:
    if not quick and memory.available() < ONE_BILLION_NEEDS:
        return {
            "skipped": f"needs {ONE_BILLION_NEEDS / memory.GIB:.0f} GiB available, "
            f"{memory.available() / memory.GIB:.1f} GiB are"
        }
    return _global_case(60, 4096, "bfloat16", quick_shape=(4, 512))(lib, quick)


# forward under no_grad -------------------------------------------------------------


def _pruned_mlps(quick: bool) -> tuple[dict[str, Any], Any]:
    """The MLP pruned by prunereg, by torch, and pruned then ``remove``d (the unpruned cost); and an input."""
    import torch
    import torch.nn.utils.prune as torch_prune
    from torch import nn

    import prunereg.prune as prunereg_prune

    width, layers, batch = (256, 4, 16) if quick else (2048, 12, 64)
    torch.manual_seed(0)
    base = nn.Sequential(*[block for _ in range(layers) for block in (nn.Linear(width, width), nn.ReLU())])
    models = {"prunereg": copy.deepcopy(base), "torch": copy.deepcopy(base), "removed": copy.deepcopy(base)}
    for name, model in models.items():
        prune = torch_prune if name == "torch" else prunereg_prune
        for module in model:
            if isinstance(module, nn.Linear):
                prune.l1_unstructured(module, "weight", amount=0.5)
                if name == "removed":
                    prune.remove(module, "weight")
    return models, torch.randn(batch, width)


@case("forward/no_grad", "forward", "12 x (Linear(2048, 2048) + ReLU), batch 64, weights pruned 50 %", libs=TOGETHER)
def forward(lib: str, quick: bool) -> dict[str, Any]:
    import torch

    models, x = _pruned_mlps(quick)
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.no_grad():
        for model in models.values():
            for _ in range(3):
                model(x)
        for _ in range(5 if quick else 25):  # round robin: every model sees the same machine load
            for name, model in models.items():
                start = time.perf_counter()
                model(x)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()} | {"rounds": len(times["torch"])}


# torch.compile ----------------------------------------------------------------------


def _interleaved(steps: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds of each step, run round robin so that every one sees the same machine load."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


@case(
    "compile/forward",
    "compile",
    "compiled forward, 12 x (Linear(2048, 2048) + ReLU), batch 64, pruned 50 %",
    libs=TOGETHER,
)
def compiled_forward(lib: str, quick: bool) -> dict[str, Any]:
    import torch
    from torch._dynamo.testing import CompileCounterWithBackend

    models, x = _pruned_mlps(quick)
    counters = {name: CompileCounterWithBackend("inductor") for name in models}
    compiled = {name: torch.compile(model, backend=counters[name]) for name, model in models.items()}
    with torch.no_grad():
        for function in compiled.values():
            for _ in range(3):
                function(x)
        result: dict[str, Any] = _interleaved(
            {name: lambda f=f: f(x) for name, f in compiled.items()}, 5 if quick else 25
        )
    return result | {"graphs": {name: counter.frame_count for name, counter in counters.items()}}


@case("compile/train_step", "compile", "compiled training step (forward, backward, SGD), same model", libs=TOGETHER)
def compiled_train_step(lib: str, quick: bool) -> dict[str, Any]:
    import torch
    from torch._dynamo.testing import CompileCounterWithBackend

    models, x = _pruned_mlps(quick)
    counters = {name: CompileCounterWithBackend("inductor") for name in models}
    steps = {}
    for name, model in models.items():
        compiled = torch.compile(model, backend=counters[name])
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step(compiled: Any = compiled, optimizer: Any = optimizer) -> None:
            compiled(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()

        for _ in range(3):
            step()
        steps[name] = step
    result: dict[str, Any] = _interleaved(steps, 5 if quick else 15)
    return result | {"graphs": {name: counter.frame_count for name, counter in counters.items()}}


# many small layers, pruned one by one ------------------------------------------------

SMALL_LAYERS = 400
SMALL_STEPS = ("l1_unstructured", "l1_unstructured again", "ln_structured", "prune then remove")


def _small_layer_step(prune: Any, step: str) -> tuple[Callable[[Any], object], Callable[[Any], object] | None]:
    """What one step does to one layer, and what it needs done first (outside the time)."""
    if step == "l1_unstructured":
        return lambda m: prune.l1_unstructured(m, "weight", amount=0.5), None
    if step == "l1_unstructured again":
        return (
            lambda m: prune.l1_unstructured(m, "weight", amount=0.5),
            lambda m: prune.l1_unstructured(m, "weight", amount=0.5),
        )
    if step == "ln_structured":
        return lambda m: prune.ln_structured(m, "weight", amount=0.5, n=2, dim=0), None

    def prune_then_remove(m: Any) -> None:
        prune.l1_unstructured(m, "weight", amount=0.5)
        prune.remove(m, "weight")

    return prune_then_remove, None


@case(
    "small_layers",
    "small_layers",
    f"{SMALL_LAYERS} x nn.Linear(64, 64), pruned one by one, one thread",
    libs=TOGETHER,
)
def small_layers(lib: str, quick: bool) -> dict[str, Any]:
    """Per-layer time of the pruning calls most users make in a loop over modules, both libraries in one run.

    The libraries alternate call by call, so that both see the same load on a
    busy machine; each figure is the median time of one call.
    """
    import torch
    from torch import nn

    torch.set_num_threads(1)
    layers, rounds = (100, 3) if quick else (SMALL_LAYERS, 5)
    torch.manual_seed(0)
    template = [nn.Linear(64, 64) for _ in range(layers)]
    result: dict[str, Any] = {"layers": layers, "rounds": rounds}
    for step in SMALL_STEPS:
        calls = {name: _small_layer_step(_prune_module(name), step) for name in BOTH}
        times: dict[str, list[float]] = {name: [] for name in BOTH}
        for round_number in range(rounds + 1):  # the first round warms up
            modules = {name: copy.deepcopy(template) for name in BOTH}
            for name, (_, setup) in calls.items():
                for module in modules[name] if setup is not None else ():
                    setup(module)
            gc.collect()
            for index in range(layers):  # call by call, alternating: both see the same machine load
                for name, (run, _) in calls.items():
                    start = time.perf_counter()
                    run(modules[name][index])
                    if round_number:
                        times[name].append(time.perf_counter() - start)
        result[step] = {name: statistics.median(values) for name, values in times.items()}
    return result


# command line ---------------------------------------------------------------------


@case("cli", "cli", "prunereg command line", libs=TOGETHER)
def cli(lib: str, quick: bool) -> dict[str, Any]:
    executable = Path(sys.executable).with_name("prunereg")
    commands = {
        "prunereg --help": [str(executable), "--help"],
        "prunereg list": [str(executable), "list"],
        "python -c 'import torch' (reference)": [sys.executable, "-c", "import torch"],
    }
    result = {}
    for label, command in commands.items():
        subprocess.run(command, check=True, capture_output=True)
        times = []
        for _ in range(3 if quick else 7):
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
        result[label] = statistics.median(times)
    return result


def main(argv: list[str]) -> None:
    name, lib = argv[0], argv[1]
    quick = "--quick" in argv
    if memory.available():
        memory.cap_address_space(int(memory.available() * 0.85))
    result = CASES[name].run(lib, quick)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
