"""prunereg.slim beside Torch-Pruning on the model zoo of benchmarks/slim_zoo.py: docs/benchmarks.md's zoo section.

    python benchmarks/slim_zoo_peer.py                         # every model; writes the section (tens of minutes)
    python benchmarks/slim_zoo_peer.py --models resnet18 hf_llama          # some models: the section printed
    python benchmarks/slim_zoo_peer.py --json zoo.json         # keep the raw results; a rerun does what is missing

Every (model, library) runs in a fresh Python process on ``slim.THREADS``
threads: the model is built (random weights, eval mode, one small input), its
output head found (the last module with parameters of its own to start in a
forward: the classifier, ``lm_head``), and it is slimmed at ``ratio=0.5`` with
no hand configuration: ``prunereg.slim(model, inputs, ratio=0.5)``, and
Torch-Pruning's plain README call with the head in ``ignored_layers``
(benchmarks/slim.py). A call past ``--timeout`` seconds is stopped: *hung*.
Measured: parameters and MACs after, the slimming time of the first call in
the process and the median of three more on fresh copies (*warm*), and the peak
resident memory above the loaded model while slimming; for prunereg also
slim_zoo's no-op and masked-equality checks. The speed-ups at batch 1 and 32
come from one more fresh process per model, where the original and the models
every library slimmed are timed in turn: latencies of separate processes differ
by more than the libraries do. Needs timm, torchvision,
transformers and torch-pruning (the ``bench`` and ``zoo`` extras); without torch_pruning
only prunereg runs, and the section says so.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import slim  # noqa: E402  (benchmarks/slim.py: the libraries' calls, the measurements, the runner)
import slim_zoo  # noqa: E402  (the zoo and prunereg's checks; keeps torchvision's meta registrations from loading)
from llm import replace_between  # noqa: E402

MARKER = "slim-zoo"
HEADING = "## Slimming the model zoo beside Torch-Pruning"
LIBRARIES = (slim.PRUNEREG, slim.TP)
TIMEOUT = 120  # seconds for one slimming call: past it the library hung on the model
WARM_CALLS = 3  # a warm call now and then pays a full collection of Python's garbage (over 100 ms): the median
REPEATS = slim.REPEATS[False]  # rounds of forwards in turn per batch size, as benchmarks/slim.py times them
BATCHES = tuple(REPEATS)
SPEED_UP_MARGIN = 0.05  # the speed-up target: within 5 % of Torch-Pruning's median
FEW_LAYERS_SECONDS = 1.0
FEW_LAYERS = tuple(name for name in slim_zoo.ZOO if name.startswith("hf_"))
"""The zoo's models of a few layers (two blocks each), where slimming must take under a second."""
PACKAGES = ("torch-pruning", "transformers", "timm", "torchvision")

OK, REFUSED, HUNG, BROKEN, CRASHED, UNBUILT = "ok", "refused", "hung", "broken", "crashed", "not built"
STATUSES = (OK, REFUSED, HUNG, BROKEN, CRASHED, UNBUILT)
"""What a library did with a model: slimmed it with the output shapes kept; raised; ran past the deadline;
slimmed it into a model whose outputs changed shape or that no longer runs; killed its process; (the zoo's
builder failed on this torchvision or timm)."""


# one (model, library) in this process -------------------------------------------------------------


def output_head(model: Any, inputs: tuple[Any, ...]) -> str:
    """The name of the last module with parameters of its own to start in a forward: the one making the outputs.

    Found from a forward rather than from names, since every zoo calls its head
    something else (``fc``, ``classifier.1``, ``head.fc``, ``lm_head``); a module
    holding its own parameters and children (ViT's class token) starts before
    its children, so the head is still the last.
    """
    import torch

    started: list[str] = []
    handles = [
        module.register_forward_pre_hook(lambda *_, name=name: started.append(name))
        for name, module in model.named_modules()
        if next(module.parameters(recurse=False), None) is not None
    ]
    try:
        with torch.no_grad():
            model(*inputs, **slim_zoo.forward_kwargs(model))
    finally:
        for handle in handles:
            handle.remove()
    if not started:
        raise ValueError(f"{type(model).__name__} runs no module with parameters: it has no output head to keep")
    return started[-1]


def _spec(name: str, model: Any, inputs: tuple[Any, ...]) -> slim.Model:
    """How benchmarks/slim.py's helpers call zoo model ``name``: its output head kept, a Hugging Face model uncached."""
    return slim.Model(name, name, output_head(model, inputs), forward=tuple(slim_zoo.forward_kwargs(model).items()))


def _parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _stopped(result: dict[str, Any], status: str, error: BaseException) -> dict[str, Any]:
    return {**result, "status": status, "said": slim._failure(error)}


def run_one(name: str, library: str, timeout: int) -> dict[str, Any]:
    """Build zoo model ``name``, slim it with ``library`` at ``slim.RATIO`` and measure it (see the module doc)."""
    import torch

    torch.set_num_threads(slim.THREADS)
    torch.manual_seed(0)
    try:
        model, inputs = slim_zoo.ZOO[name]()
    except Exception as error:  # a builder this torchvision or timm does not have
        return _stopped({}, UNBUILT, error)
    spec = _spec(name, model, inputs)
    result: dict[str, Any] = {
        "head": spec.head,
        "params_before": _parameters(model),
        "macs_before": slim.macs(model, inputs, spec),
    }
    original = copy.deepcopy(model)
    shapes = [output.shape for output in slim_zoo._outputs(model, inputs)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result["seconds"], result["peak"] = slim.slim_measured(model, inputs, slim.RATIO, spec, library, timeout)
        except slim.SlimTimeout as error:
            return _stopped(result, HUNG, error)
        except Exception as error:  # a library's refusal is a result
            return _stopped(result, REFUSED, error)
        try:
            after = [output.shape for output in slim_zoo._outputs(model, inputs)]
        except Exception as error:
            return _stopped(result, BROKEN, error)
        if after != shapes:
            return {**result, "status": BROKEN, "said": f"output shapes changed: {shapes} -> {after}"}
        result.update(status=OK, params=_parameters(model), macs=slim.macs(model, inputs, spec))
        try:
            warm = [
                slim.slim_timed(copy.deepcopy(original), inputs, slim.RATIO, spec, library, timeout)
                for _ in range(WARM_CALLS)
            ]
            result["warm_seconds"] = statistics.median(warm)
        except Exception as error:  # the first call worked: the row keeps its figures and says this
            result["warm"] = slim._failure(error)
        if library == slim.PRUNEREG:
            result["no_op"] = slim_zoo.no_op_check(copy.deepcopy(original), inputs, timeout)
            result["masked"] = slim_zoo.masked_check(copy.deepcopy(original), inputs, timeout)
    return result


def latency_one(name: str, libraries: list[str], timeout: int) -> dict[str, dict[str, Any]]:
    """Build zoo model ``name``, slim a copy with each of ``libraries`` and time them all with the original in turn.

    Per library: the original's and its slimmed model's median latency at each
    of :data:`BATCHES` (``original_latency_1``, ``latency_1``, ...), or
    ``latency_error`` where its slimming fails this time.
    """
    import torch

    torch.set_num_threads(slim.THREADS)
    torch.manual_seed(0)
    model, inputs = slim_zoo.ZOO[name]()
    spec = _spec(name, model, inputs)
    slimmed: dict[str, Any] = {}
    found: dict[str, dict[str, Any]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for library in libraries:
            copied = copy.deepcopy(model)
            try:
                slim.slim_timed(copied, inputs, slim.RATIO, spec, library, timeout)
            except Exception as error:  # a library that slimmed it in its own process can still hang here
                found[library] = {"latency_error": slim._failure(error)}
                continue
            slimmed[library] = copied
    if slimmed:
        found.update(slim.latencies_of(model, slimmed, inputs, spec, REPEATS))
    return found


# the runner -----------------------------------------------------------------------------------------


def run_in_subprocess(name: str, library: str, timeout: int) -> dict[str, Any]:
    """:func:`run_one` in a fresh process; stopped (hung) after the time of four slimming calls and some."""
    command = [sys.executable, __file__, "--one", name, library, "--timeout", str(timeout)]
    process_timeout = 4 * timeout + 300
    try:
        result = slim.result_of(command, process_timeout)
    except subprocess.TimeoutExpired:
        return {"status": HUNG, "said": f"process stopped after {process_timeout} s"}
    if "error" in result:  # the process died without a result
        return {"status": CRASHED, "said": result["error"]}
    return result


def latency_in_subprocess(name: str, libraries: list[str], timeout: int) -> dict[str, dict[str, Any]]:
    """:func:`latency_one` in a fresh process; a process that dies or hangs gives each library a ``latency_error``."""
    command = [sys.executable, __file__, "--latency", name, *libraries, "--timeout", str(timeout)]
    process_timeout = len(libraries) * timeout + 600
    try:
        found = slim.result_of(command, process_timeout)
    except subprocess.TimeoutExpired:
        found = {"error": f"process stopped after {process_timeout} s"}
    if "error" in found:
        return {library: {"latency_error": found["error"]} for library in libraries}
    return found


def add_latencies(results: dict[str, dict[str, dict[str, Any]]], name: str, timeout: int) -> None:
    """Time model ``name`` with every library that slimmed it (in turn, one process), unless timed already."""
    by_library = results.get(name, {})
    if any(
        result.get("status") == OK and "latency_1" not in result and "latency_error" not in result
        for result in by_library.values()
    ):
        timed = [library for library, result in by_library.items() if result.get("status") == OK]
        for library, found in latency_in_subprocess(name, timed, timeout).items():
            by_library[library].update(found)


# the report -----------------------------------------------------------------------------------------


def speed_up(result: dict[str, Any], batch: int = 1) -> float | None:
    """The original's latency over the slimmed model's at ``batch``; ``None`` where it was not timed."""
    if f"latency_{batch}" not in result:
        return None
    return float(result[f"original_latency_{batch}"] / result[f"latency_{batch}"])


def _median(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def _cell(value: float | None, form: str = "seconds") -> str:
    if value is None:
        return "-"
    return slim._seconds(value) if form == "seconds" else f"x{value:.2f}"


def _part(after: int, before: int) -> str:
    return f"{slim._count(after)} ({after / before:.0%})"


def model_table(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    columns = [
        "model", "library", "status", "parameters", "MACs", "speed-up, batch 1", "batch 32", "slimming time", "warm",
        "peak memory", "no-op", "masked",
    ]  # fmt: skip
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name, by_library in results.items():
        for library, result in by_library.items():
            status = result["status"]
            if status != OK:
                cells = [f"{status}: `{result['said']}`", *[""] * (len(columns) - 3)]
            else:
                cells = [
                    OK,
                    _part(result["params"], result["params_before"]),
                    _part(result["macs"], result["macs_before"]),
                    *(_cell(speed_up(result, batch), "speed-up") for batch in BATCHES),
                    slim._seconds(result["seconds"]),
                    _cell(result.get("warm_seconds")) if "warm" not in result else f"failed: `{result['warm']}`",
                    f"{result['peak'] / 2**20:.0f} MiB",
                    *(f"`{result[check]}`" if check in result else "-" for check in ("no_op", "masked")),
                ]
            rows.append(f"| {name} | {library} | " + " | ".join(cells) + " |")
    return rows


def _slimmed(results: dict[str, dict[str, dict[str, Any]]], libraries: tuple[str, ...]) -> list[str]:
    """The models every one of ``libraries`` slimmed."""
    return [n for n, by in results.items() if all(by.get(library, {}).get("status") == OK for library in libraries)]


def _medians(results: dict[str, dict[str, dict[str, Any]]], library: str, models: list[str]) -> dict[str, Any]:
    """Median first-call and warm slimming times and speed-ups (``speed_up_1``, ...) of ``library`` over ``models``."""
    runs = [results[name][library] for name in models]
    return {
        "seconds": _median([run["seconds"] for run in runs]),
        "warm_seconds": _median([run.get("warm_seconds") for run in runs]),
        **{f"speed_up_{batch}": _median([speed_up(run, batch) for run in runs]) for batch in BATCHES},
    }


def fewer_removed(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """The models both slim where prunereg removes fewer parameters than Torch-Pruning."""
    both = _slimmed(results, (slim.PRUNEREG, slim.TP))
    return [name for name in both if results[name][slim.PRUNEREG]["params"] > results[name][slim.TP]["params"]]


def summary_table(results: dict[str, dict[str, dict[str, Any]]], libraries: tuple[str, ...]) -> list[str]:
    rows = ["| | " + " | ".join(libraries) + " |", "|---|" + "---|" * len(libraries)]
    for status in STATUSES:
        counts = [sum(by.get(library, {}).get("status") == status for by in results.values()) for library in libraries]
        rows.append(f"| {status} | " + " | ".join(map(str, counts)) + " |")
    both = _slimmed(results, libraries)
    own = {library: _slimmed(results, (library,)) for library in libraries}
    together = {library: _medians(results, library, both) for library in libraries}
    alone = {library: _medians(results, library, own[library]) for library in libraries}
    for what, key, form in (
        ("slimming time", "seconds", "seconds"),
        ("slimming time, warm", "warm_seconds", "seconds"),
        *((f"speed-up, batch {batch}", f"speed_up_{batch}", "speed-up") for batch in BATCHES),
    ):
        if len(libraries) > 1:
            rows.append(
                f"| median {what}, the {len(both)} models all slim | "
                + " | ".join(_cell(together[library][key], form) for library in libraries)
                + " |"
            )
        rows.append(
            f"| median {what}, every model each slims | "
            + " | ".join(f"{_cell(alone[library][key], form)} ({len(own[library])})" for library in libraries)
            + " |"
        )
    return rows


def targets_table(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Issue 31's targets for the zoo (item 6) and for the slimming time (item 3): met or not."""
    rows = ["| item | target | measured | met |", "|---|---|---|---|"]

    def add(item: int, target: str, measured: str, met: bool | None) -> None:
        rows.append(f"| {item} | {target} | {measured} | {'-' if met is None else 'yes' if met else '**no**'} |")

    built = [name for name, by in results.items() if by.get(slim.PRUNEREG, {}).get("status") not in (None, UNBUILT)]
    mine = [results[name][slim.PRUNEREG] for name in built]
    slims = sum(run["status"] == OK for run in mine)
    add(6, "every model slims at `ratio=0.5` with no hand configuration", f"{slims} of {len(built)}",
        slims == len(built) if built else None)  # fmt: skip
    for check, what in (("no_op", "no-op"), ("masked", "masked equality")):
        passed = sum(str(run.get(check, "")).startswith("ok") for run in mine)
        add(6, f"{what} on every model", f"{passed} of {len(built)}", passed == len(built) if built else None)
    both = _slimmed(results, (slim.PRUNEREG, slim.TP))
    fewer = fewer_removed(results)
    add(6, "parameters removed no fewer than Torch-Pruning's where both work",
        f"fewer on {len(fewer)} of {len(both)}" + (f": {', '.join(fewer)}" if fewer else ""),
        not fewer if both else None)  # fmt: skip
    ours, theirs = _medians(results, slim.PRUNEREG, both), _medians(results, slim.TP, both)
    for item, target, key, form in (
        (6, f"median batch-1 speed-up within {SPEED_UP_MARGIN:.0%} of Torch-Pruning's", "speed_up_1", "speed-up"),
        (3, "median slimming time no slower than Torch-Pruning's", "seconds", "seconds"),
        (3, "median slimming time, warm, no slower than Torch-Pruning's", "warm_seconds", "seconds"),
    ):
        a, b = ours[key], theirs[key]
        met = None if a is None or b is None else a >= (1 - SPEED_UP_MARGIN) * b if form == "speed-up" else a <= b
        add(item, f"{target} (the models both slim)", f"{_cell(a, form)} vs {_cell(b, form)}", met)
    few = [results[name][slim.PRUNEREG] for name in FEW_LAYERS if name in results and slim.PRUNEREG in results[name]]
    for key, what in (("seconds", "first call"), ("warm_seconds", "warm")):
        times = [run.get(key) for run in few]
        slowest = None if not times or None in times else max(times)
        add(3, f"under {FEW_LAYERS_SECONDS:g} s on a model of a few layers ({', '.join(FEW_LAYERS)}), {what}",
            f"slowest {_cell(slowest)}", None if slowest is None else slowest < FEW_LAYERS_SECONDS)  # fmt: skip
    return rows


def report(results: dict[str, dict[str, dict[str, Any]]], libraries: tuple[str, ...], about: str) -> str:
    fewer = fewer_removed(results)
    lines = [
        f"`prunereg.slim(model, inputs, ratio={slim.RATIO})` and Torch-Pruning's plain call (its README's",
        f"`MagnitudePruner`, L2 importance, `pruning_ratio={slim.RATIO}`, the output head in `ignored_layers`) on",
        "every model of `benchmarks/slim_zoo.py` (torchvision and timm classifiers at 64x64 or their smallest",
        "input, Hugging Face causal LMs of two blocks built from configs; random weights), no hand configuration,",
        "each (model, library) in a fresh process. *status*: ok (output shapes kept), refused (the library",
        "raised), hung (stopped past the deadline), broken (slimmed, but the outputs changed shape or the",
        "forward fails). *parameters* and *MACs* (one forward, torch's FlopCounterMode) after slimming, in per",
        "cent of the original's; *speed-up*: the original's latency at batch 1 and 32 over the slimmed model's,",
        "medians of forwards taken in turn in one more fresh process holding the original and every library's",
        "slimmed model (latencies of separate processes differ by more than the libraries do); *slimming",
        "time*: the first call in the process (with its one-time imports), *warm* the median of three more",
        "calls on fresh copies; *peak memory*: resident high-water mark",
        "above the loaded model while slimming. *no-op* and *masked* are prunereg's exactness checks",
        "(`benchmarks/slim_zoo.py`): slimming with no masks changes no bit; a quarter of a middle channel",
        "group masked, then slimmed, gives the masked model's outputs.",
        *([] if slim.TP in libraries else ["**Torch-Pruning did not run (not installed): its columns are absent.**"]),
        "",
        *model_table(results),
        "",
        "### Summary",
        "",
        *summary_table(results, libraries),
        "",
        *(
            [f"prunereg removes fewer parameters than Torch-Pruning on: {', '.join(fewer) or 'none'}.", ""]
            if slim.TP in libraries
            else []
        ),
        "### Targets (issue 31)",
        "",
        *targets_table(results),
        "",
        f"Measured on {about}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(slim_zoo.ZOO), help="these models only (default: all)")
    parser.add_argument(
        "--libraries", nargs="+", choices=LIBRARIES, help="these libraries only (default: both, where installed)"
    )
    parser.add_argument("--timeout", type=int, default=TIMEOUT, help="seconds per slimming call before it is hung")
    parser.add_argument(
        "--output", type=Path, help=f"write the section into this page (default: {slim.DEFAULT_OUTPUT} for the "
        "whole zoo; printed for some models)"
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="keep the raw results here; what it holds already is not rerun")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "LIBRARY"), help=argparse.SUPPRESS)
    parser.add_argument("--latency", nargs="+", metavar="MODEL LIBRARY", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one[0], args.one[1], args.timeout)))
        return 0
    if args.latency:
        print("RESULT " + json.dumps(latency_one(args.latency[0], args.latency[1:], args.timeout)))
        return 0
    models = args.models or list(slim_zoo.ZOO)
    libraries = tuple(args.libraries or (LIBRARIES if slim.has_torch_pruning() else (slim.PRUNEREG,)))
    before, started = slim.load(), time.perf_counter()
    results: dict[str, dict[str, dict[str, Any]]] = (
        json.loads(args.json.read_text()) if args.json and args.json.exists() else {}
    )
    reused = 0
    for name in models:
        for library in libraries:
            if library in results.get(name, {}):
                reused += 1
                continue
            print(f"{name} [{library}] ...", end=" ", flush=True, file=sys.stderr)
            results.setdefault(name, {})[library] = run_in_subprocess(name, library, args.timeout)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1) + "\n")
            print(results[name][library]["status"], f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        add_latencies(results, name, args.timeout)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1) + "\n")
    results = {name: {lib: results[name][lib] for lib in libraries} for name in models}
    command = "python benchmarks/slim_zoo_peer.py" + (f" --models {' '.join(models)}" if args.models else "")
    command += f" --timeout {args.timeout}" if args.timeout != TIMEOUT else ""
    minutes = (time.perf_counter() - started) / 60
    about = slim.machine(before, slim.load(), PACKAGES) + f"; the run took {minutes:.1f} min"
    if reused:
        about += f" ({reused} results kept from an earlier run in {args.json.name if args.json else '?'})"
    text = report(results, libraries, f"{about}. Reproduce: `{command}`")
    output = args.output or (None if args.models else slim.DEFAULT_OUTPUT)
    if output is None:
        print(text)
        return 0
    replace_between(output, MARKER, text, HEADING)
    print(f"wrote the zoo section of {output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
