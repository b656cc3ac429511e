"""prunereg.slim against Torch-Pruning 1.6.1, in the same run: docs/benchmarks.md's slimming section and its plot.

    python benchmarks/slim.py                     # full-size models; writes the docs (see the time budget below)
    python benchmarks/slim.py --quick             # tiny models: a smoke test, printed, docs left alone
    python benchmarks/slim.py --models resnet50   # some models only (in the docs too)
    python benchmarks/slim.py --json r.json --only resnet50 llama   # rerun these; the other models' results kept

Needs the ``bench`` extra (``pip install -c constraints.txt -e ".[bench]"``:
torch-pruning, transformers, matplotlib); without torch_pruning its rows are
left out and the section says so. The models are built from transformers configs (no download) by
tests/support/slim_models.py. Every (model, library) pair runs in a fresh Python
process with ``torch.set_num_threads(2)``: its peak memory is its own, and a
library that hangs is stopped after ``SLIM_TIMEOUT`` seconds. The latencies come
from one more fresh process per model, which slims a copy with every library
that worked (at every sweep ratio too) and times them all with the original in
turn: latencies of separate processes differ by more than the libraries do. The full run is
sized to about 12 minutes on 2 quiet cores (estimated from the models' MACs);
past ``--budget`` minutes (14.5) what is left is skipped and its rows say so;
with ``--json results.json`` a second run does only what the first did not.

Torch-Pruning runs twice where its examples configure models by hand: once as a
new user would call it (``MagnitudePruner`` with the output head in
``ignored_layers``, as in its README), and once with the hand configuration its
examples write for that model (head counts, an output transform, attributes
fixed after pruning), labelled so. On the Llama, where that configuration's graph
search does not end either, a third run ignores every attention module (the only
configuration found that runs there). Torch-Pruning's ``__version__`` says 1.6.0;
the installed distribution is 1.6.1.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import gc
import importlib.metadata
import importlib.util
import itertools
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
import memory  # noqa: E402

# torchvision (the zoo extra; timm and transformers import it where installed) must not load its detection-op
# registrations: its wheel on these machines is a CUDA build, which the CPU torch cannot register.
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
from llm import replace_between  # noqa: E402

DEFAULT_OUTPUT = ROOT / "docs" / "benchmarks.md"
IMAGE = "slim-latency.svg"  # benchmarks/plots.py draws it (plots.SLIM)
MARKER = "slim"
HEADING = "## Slimming against Torch-Pruning"
THREADS = 2
RATIO = 0.5
SWEEP_RATIOS = (0.1, 0.3, 0.5, 0.7)  # four slimming runs of the full Llama: the run stays under 15 minutes
QUICK_SWEEP_RATIOS = (0.3, 0.6)
REPEATS = {False: {1: 24, 32: 6}, True: {1: 2, 4: 1}}
"""Rounds of forwards in turn, full and quick: at batch 1 every order of up to four models; batch 32 takes seconds."""
SLIM_TIMEOUT = {False: 60, True: 20}  # seconds for one slimming call, full and quick: 10x what Torch-Pruning needs
PROCESS_TIMEOUT = 600
BUDGET = 14.5  # minutes: what is still to run after that is skipped, and says so
MINIMUM_LEFT = 20  # seconds: below this no (model, library) process starts
SKIPPED = "skipped:"

ORIGINAL, PRUNEREG, TP = "original", "prunereg", "Torch-Pruning"
TP_HAND, TP_MLP = "Torch-Pruning, hand-configured", "Torch-Pruning, hand-configured, attention left alone"
TOOLS = (ORIGINAL, PRUNEREG, TP, TP_HAND, TP_MLP)
TORCH_PRUNING = (TP, TP_HAND, TP_MLP)
"""Torch-Pruning's calls, in the order the targets and the sweep look for one that works."""


@dataclass(frozen=True)
class Model:
    title: str
    builder: str
    """The builder's name in tests/support/slim_models.py."""
    head: str
    """The output head, which no library may narrow."""
    hand: str | None = None
    """What Torch-Pruning's examples configure by hand for this model; None where its plain call is all."""
    attention_left_alone: str | None = None
    """Where even the hand configuration fails: the one that runs, with every attention module ignored."""
    forward: tuple[tuple[str, Any], ...] = ()
    """Keyword arguments of every timed forward."""


MODELS = {
    "resnet50": Model("ResNet-50 (HF, 224x224)", "hf_resnet50", "classifier"),
    "vit": Model(
        "ViT-B/16 (HF, 224x224)",
        "hf_vit",
        "classifier",
        hand="`num_heads` per q/k/v projection, whole heads, `output_transform`, head counts set after",
    ),
    "bert": Model(
        "BERT-base (HF, 128 tokens)",
        "hf_bert",
        "classifier",
        hand="`num_heads` per query/key/value, whole heads, `output_transform`, head counts set after",
    ),
    "llama": Model(
        "SmolLM2-135M-shaped Llama (HF, 128 tokens)",
        "hf_smollm2_llama",
        "lm_head",
        hand="`num_heads` for q (9) and k/v (3), whole heads, `output_transform` (TP's LLM example)",
        attention_left_alone="`output_transform`, every attention module in `ignored_layers`: the MLPs alone",
        forward=(("use_cache", False),),
    ),
    "cnn": Model("CNN: concat, depthwise, residual (224x224)", "concat_depthwise_residual_cnn", "head"),
}
SWEEP_MODELS = ("resnet50", "llama")


# one (model, library) in this process -------------------------------------------------------------


class SlimTimeout(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Stop a slimming call that runs past ``seconds`` (Torch-Pruning's graph search can loop for ever)."""

    def stop(signum: int, frame: Any) -> None:
        raise SlimTimeout(f"did not finish in {seconds} s (stopped)")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _module(model: Any, path: str) -> Any:
    return model.get_submodule(path)


def slim_prunereg(model: Any, inputs: tuple[Any, ...], ratio: float, spec: Model) -> None:
    import prunereg

    prunereg.slim(model, inputs, ratio=ratio)


def slim_torch_pruning(model: Any, inputs: tuple[Any, ...], ratio: float, spec: Model) -> None:
    """Torch-Pruning as its README shows it: magnitude (L2) importance, the output head ignored."""
    import torch_pruning as tp

    pruner = tp.pruner.MagnitudePruner(
        model,
        inputs[0] if len(inputs) == 1 else inputs,
        importance=tp.importance.MagnitudeImportance(p=2),
        pruning_ratio=ratio,
        ignored_layers=[_module(model, spec.head)],
    )
    pruner.step()


def slim_torch_pruning_by_hand(model: Any, inputs: tuple[Any, ...], ratio: float, spec: Model) -> None:
    """Torch-Pruning with the configuration its examples write for attention models (prune_hf_vit/bert, prune_llm)."""
    import torch_pruning as tp

    num_heads: dict[Any, int] = {}
    attentions = []
    for module in model.modules():
        if hasattr(module, "q_proj") and hasattr(module, "k_proj") and hasattr(module, "v_proj"):  # ViT, Llama
            heads = getattr(module, "num_attention_heads", None) or model.config.num_attention_heads
            kv_heads = getattr(model.config, "num_key_value_heads", None) or heads
            num_heads.update({module.q_proj: heads, module.k_proj: kv_heads, module.v_proj: kv_heads})
            attentions.append((module, module.q_proj, module.k_proj))
        elif hasattr(module, "query") and hasattr(module, "num_attention_heads"):  # BERT
            heads = module.num_attention_heads
            num_heads.update({module.query: heads, module.key: heads, module.value: heads})
            attentions.append((module, module.query, module.key))
    pruner = tp.pruner.BasePruner(
        model,
        inputs[0],
        importance=tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean"),
        pruning_ratio=ratio,
        ignored_layers=[_module(model, spec.head)],
        num_heads=num_heads,
        prune_num_heads=True,
        prune_head_dims=False,
        head_pruning_ratio=ratio,
        output_transform=lambda out: out.logits,
    )
    pruner.step()
    for module, query, key in attentions:  # the head counts the modules keep by hand, as the examples do
        heads = pruner.num_heads[query]
        if hasattr(module, "num_attention_heads"):
            module.num_attention_heads = heads
        if hasattr(module, "all_head_size"):
            module.all_head_size = query.out_features
        if hasattr(module, "num_key_value_groups"):
            module.num_key_value_groups = heads // pruner.num_heads[key]


def slim_torch_pruning_attention_left_alone(model: Any, inputs: tuple[Any, ...], ratio: float, spec: Model) -> None:
    """Torch-Pruning with every attention module ignored: on a transformers 5 Llama its graph search then ends."""
    import torch_pruning as tp

    attentions = [module for module, _ in _attention_projections(model)]
    pruner = tp.pruner.BasePruner(
        model,
        inputs[0],
        importance=tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean"),
        pruning_ratio=ratio,
        ignored_layers=[_module(model, spec.head), *attentions],
        output_transform=lambda out: out.logits,
    )
    pruner.step()


SLIMMERS: dict[str, Callable[[Any, tuple[Any, ...], float, Model], None]] = {
    PRUNEREG: slim_prunereg,
    TP: slim_torch_pruning,
    TP_HAND: slim_torch_pruning_by_hand,
    TP_MLP: slim_torch_pruning_attention_left_alone,
}


def macs(model: Any, inputs: tuple[Any, ...], spec: Model) -> int:
    """Multiply-accumulates of one forward at the example inputs' batch, counted the same way for every library."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    # its module tracker hooks every module input needing grad, and under no_grad fails on a parameter passed as
    # one (timm's CaiT hands its class token to a block): nothing needs grad while counting
    needed = [(parameter, parameter.requires_grad) for parameter in model.parameters()]
    try:
        for parameter, _ in needed:
            parameter.requires_grad_(False)
        with torch.no_grad(), counter:
            model(*inputs, **dict(spec.forward))
    finally:
        for parameter, flag in needed:
            parameter.requires_grad_(flag)
    return counter.get_total_flops() // 2


def latencies_in_turn(models: list[Any], inputs: tuple[Any, ...], spec: Model, repeats: int) -> list[float]:
    """Median seconds of each model's forwards, taken in turn (one forward of each per round) after a warm-up each.

    Batch-1 forwards of two processes differ by up to 2x on the same model (where
    the allocator and the threads land); in one process, in turn, the ratios are
    the models' and not the processes'. The rounds go through every order of the
    models in turn, so that no model always follows the same one: a model run
    right after the larger original is slower (timm's ConvNeXt-Atto slimmed
    alike by both libraries at batch 32: x2.30 against x2.60-2.82, the other way
    round x2.73-2.77 against x2.25-2.27). Past four models (24 orders) the
    rounds take orders shuffled from a fixed seed: the first orders of many
    models, in sequence, would all start alike.
    """
    import torch

    kwargs = dict(spec.forward)
    times: list[list[float]] = [[] for _ in models]
    orders: Iterator[tuple[int, ...]]
    if len(models) <= 4:
        orders = itertools.cycle(itertools.permutations(range(len(models))))
    else:
        shuffler = random.Random(0)
        orders = iter(lambda: tuple(shuffler.sample(range(len(models)), len(models))), None)
    with torch.no_grad():
        for model in models:
            model(*inputs, **kwargs)
        for _ in range(repeats):
            for index in next(orders):
                start = time.perf_counter()
                models[index](*inputs, **kwargs)
                times[index].append(time.perf_counter() - start)
    return [statistics.median(kept) for kept in times]


def latencies_of(
    original: Any,
    slimmed: dict[str, Any],
    inputs: tuple[Any, ...],
    spec: Model,
    repeats: dict[int, int],
) -> dict[str, dict[str, float]]:
    """Per label of ``slimmed``: its and the original's median latency at each batch of ``repeats``, timed in turn.

    The keys are ``latency_<batch>`` and ``original_latency_<batch>``; the
    inputs are ``inputs`` repeated to each batch size. With nothing slimmed the
    original is timed alone, under the label :data:`ORIGINAL`.
    """
    from tests.support.slim_models import batched

    labels = list(slimmed) or [ORIGINAL]
    found: dict[str, dict[str, float]] = {label: {} for label in labels}
    for batch, rounds in repeats.items():
        times = latencies_in_turn([original, *slimmed.values()], batched(inputs, batch), spec, rounds)
        for label, seconds in zip(labels, times[1:] or times, strict=True):
            found[label].update({f"original_latency_{batch}": times[0], f"latency_{batch}": seconds})
    return found


def _failure(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}"[:160]


def slim_timed(model: Any, inputs: tuple[Any, ...], ratio: float, spec: Model, tool: str, seconds: int) -> float:
    """Seconds ``tool`` takes to slim ``model``; :class:`SlimTimeout` past ``seconds``."""
    start = time.perf_counter()
    with deadline(seconds):
        SLIMMERS[tool](model, inputs, ratio, spec)
    return time.perf_counter() - start


def slim_measured(
    model: Any, inputs: tuple[Any, ...], ratio: float, spec: Model, tool: str, seconds: int
) -> tuple[float, int]:
    """:func:`slim_timed`, and the resident high-water mark while slimming above what was resident before (bytes)."""
    gc.collect()
    memory.trim()
    memory.reset_peak()
    baseline = memory.rss()
    took = slim_timed(model, inputs, ratio, spec, tool, seconds)
    return took, memory.peak() - baseline


TAG = 1e-7
"""Step of the bias values that number attention channels: far below the weights, so no importance notices."""


def _attention_projections(model: Any) -> list[tuple[Any, list[Any]]]:
    """Each attention module with its query and key projections (ViT and Llama: q_proj/k_proj; BERT: query/key)."""
    found = []
    for module in model.modules():
        for query, key in (("q_proj", "k_proj"), ("query", "key")):
            if hasattr(module, query) and hasattr(module, key):
                found.append((module, [getattr(module, query), getattr(module, key)]))
    return found


def _head_dim(module: Any) -> int | None:
    return getattr(module, "head_dim", None) or getattr(module, "attention_head_size", None)


def tag_attention_channels(model: Any) -> None:
    """Number each query/key output channel in its bias, so the channels a library kept can be read back."""
    import torch

    with torch.no_grad():
        for _, projections in _attention_projections(model):
            for projection in projections:
                if getattr(projection, "bias", None) is not None:
                    projection.bias.copy_(torch.arange(projection.bias.numel()) * TAG)


def heads_kept_whole(model: Any, head_dims: list[int | None]) -> bool | None:
    """Whether every head the slimmed attention computes holds channels of one original head only (None: no tags).

    Removing channels anywhere in q and k still runs, but the module then regroups
    the survivors into heads that mix channels of different original heads: another
    function than any subset of the original heads.
    """
    verdicts = []
    for (module, projections), old_dim in zip(_attention_projections(model), head_dims):
        new_dim = _head_dim(module)
        for projection in projections:
            if getattr(projection, "bias", None) is None or old_dim is None or new_dim is None:
                continue
            kept = (projection.bias.detach() / TAG).round().long().tolist()
            chunks = [kept[start : start + new_dim] for start in range(0, len(kept), new_dim)]
            verdicts.append(all(len({index // old_dim for index in chunk}) == 1 for chunk in chunks))
    return all(verdicts) if verdicts else None


def _built(name: str, quick: bool) -> tuple[Any, tuple[Any, ...]]:
    """Model ``name`` and its inputs, from the same seed in every process, its attention channels numbered."""
    import torch

    from tests.support import slim_models

    torch.set_num_threads(THREADS)
    model, inputs = getattr(slim_models, MODELS[name].builder)(0, full=not quick)
    tag_attention_channels(model)
    return model, inputs


def sweep_ratios(quick: bool) -> tuple[float, ...]:
    return QUICK_SWEEP_RATIOS if quick else SWEEP_RATIOS


def run_one(name: str, tool: str, quick: bool, sweep: bool) -> dict[str, Any]:
    """Build ``name``, slim it with ``tool`` (the original: not at all) and measure all but its latency.

    The latencies come from :func:`latency_one`, in a process of their own.
    """
    from tests.support import slim_models

    spec = MODELS[name]
    model, inputs = _built(name, quick)
    head_dims = [_head_dim(module) for module, _ in _attention_projections(model)]
    shapes = slim_models.output_shapes(model, inputs)
    if sweep:
        points = []
        for ratio in sweep_ratios(quick):
            slimmed = copy.deepcopy(model)
            try:
                seconds = slim_timed(slimmed, inputs, ratio, spec, tool, SLIM_TIMEOUT[quick])
            except Exception as error:  # a library's failure is a result
                points.append({"ratio": ratio, "error": _failure(error)})
                break
            points.append({"ratio": ratio, "seconds": seconds, "params": slim_models.parameter_count(slimmed)})
            del slimmed
        return {"sweep": points}
    result: dict[str, Any] = {}
    if tool != ORIGINAL:
        again = copy.deepcopy(model)  # slimmed second, in this process: the time without first-call costs
        try:
            result["seconds"], result["peak"] = slim_measured(model, inputs, RATIO, spec, tool, SLIM_TIMEOUT[quick])
            after = slim_models.output_shapes(model, inputs)
            result["warm_seconds"] = slim_timed(again, inputs, RATIO, spec, tool, SLIM_TIMEOUT[quick])
        except Exception as error:  # a library's failure is a result
            return {"error": _failure(error)}
        del again
        if after != shapes:
            return {"error": f"output shapes changed: {shapes} -> {after}"}
        result["heads_whole"] = heads_kept_whole(model, head_dims)
    result["params"] = slim_models.parameter_count(model)
    result["macs"] = macs(model, inputs, spec)
    return result


def latency_one(name: str, tools: list[str], swept: list[str], quick: bool) -> dict[str, Any]:
    """Build ``name``, slim a copy with each of ``tools`` (each of ``swept`` at every sweep ratio too) and time them.

    All are timed in turn with the original in this process (:func:`latencies_of`):
    ``{"results": {tool: latencies}, "sweeps": {tool: [{"ratio", "latency", "original_latency"}, ...]}}``, with
    ``latency_error`` in place of a tool's latencies, or ``error`` in a point, where slimming failed this time.
    """
    spec = MODELS[name]
    model, inputs = _built(name, quick)
    slimmed: dict[str, Any] = {}
    failed: dict[str, str] = {}
    wanted = dict.fromkeys([(tool, RATIO) for tool in tools] + [(t, r) for t in swept for r in sweep_ratios(quick)])
    for tool, ratio in wanted:
        label = tool if ratio == RATIO else f"{tool} at {ratio:g}"
        copied = copy.deepcopy(model)
        try:
            slim_timed(copied, inputs, ratio, spec, tool, SLIM_TIMEOUT[quick])
        except Exception as error:  # it worked in its own process; a failure here is reported, not hidden
            failed[label] = _failure(error)
            continue
        slimmed[label] = copied
    main = {label: slimmed[label] for label in tools if label in slimmed}
    timed = latencies_of(model, main, inputs, spec, REPEATS[quick])
    original = next(iter(timed.values()))
    results: dict[str, dict[str, Any]] = {
        ORIGINAL: {key[len("original_") :]: value for key, value in original.items() if key.startswith("original_")}
    }
    results.update({tool: timed[tool] for tool in main})
    results.update({tool: {"latency_error": failed[tool]} for tool in tools if tool in failed})
    points = {label: slimmed[label] for label in slimmed if label not in main}
    at_one = {1: REPEATS[quick][1]}
    swept_times = latencies_of(model, {**{t: main[t] for t in swept if t in main}, **points}, inputs, spec, at_one)
    sweeps: dict[str, list[dict[str, Any]]] = {}
    for tool in swept:
        for ratio in sweep_ratios(quick):
            label = tool if ratio == RATIO else f"{tool} at {ratio:g}"
            point: dict[str, Any] = {"ratio": ratio}
            if label in swept_times:
                times = swept_times[label]
                point.update(latency=times["latency_1"], original_latency=times["original_latency_1"])
            else:
                point["error"] = failed.get(label, "not slimmed")
            sweeps.setdefault(tool, []).append(point)
    return {"results": results, "sweeps": sweeps}


# the runner -----------------------------------------------------------------------------------------


def run_in_subprocess(
    name: str, tool: str, quick: bool, sweep: bool = False, timeout: float = PROCESS_TIMEOUT
) -> dict[str, Any]:
    command = [sys.executable, __file__, "--one", name, tool] + ["--quick"] * quick + ["--one-sweep"] * sweep
    try:
        return result_of(command, timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{SKIPPED} process stopped after {timeout:.0f} s"}


def latency_in_subprocess(name: str, tools: list[str], swept: list[str], quick: bool, timeout: float) -> dict[str, Any]:
    """:func:`latency_one` in a fresh process; one that dies or is stopped gives every tool a ``latency_error``."""
    command = [sys.executable, __file__, "--latency", name, *tools, "--swept", *swept] + ["--quick"] * quick
    try:
        found = result_of(command, timeout)
    except subprocess.TimeoutExpired:
        found = {"error": f"{SKIPPED} process stopped after {timeout:.0f} s"}
    if "error" in found:
        return {"results": {tool: {"latency_error": found["error"]} for tool in [ORIGINAL, *tools]}, "sweeps": {}}
    return found


def _settled(error: str | None) -> bool:
    """A latency error that a second run would not redo (one not caused by the time budget)."""
    return error is not None and not error.startswith(SKIPPED)


def needs_latency(name: str, results: dict[str, dict[str, Any]], sweeps: dict[str, dict[str, Any]]) -> bool:
    """Whether a tool that slimmed ``name``, or a sweep point, has no latency (or the original none) yet."""
    rows = results.get(name, {})
    untimed = [
        result
        for result in rows.values()
        if "error" not in result and "latency_1" not in result and not _settled(result.get("latency_error"))
    ]
    points = [
        point
        for points in sweeps.get(name, {}).values()
        for point in points
        if "error" not in point and "latency" not in point and not _settled(point.get("latency_error"))
    ]
    return bool(untimed or points)


def add_latencies(
    name: str, results: dict[str, dict[str, Any]], sweeps: dict[str, dict[str, Any]], quick: bool, timeout: float
) -> None:
    """Time ``name``'s original with every tool that slimmed it and every sweep point, in one process; merge them in."""
    rows = results[name]
    tools = [tool for tool, result in rows.items() if tool != ORIGINAL and "error" not in result]
    swept = [tool for tool, points in sweeps.get(name, {}).items() if any("error" not in p for p in points)]
    found = latency_in_subprocess(name, tools, swept, quick, timeout)
    for tool, latencies in found["results"].items():
        if tool in rows and "error" not in rows[tool]:
            rows[tool].update(latencies)
    for tool, points in found["sweeps"].items():
        timed = {point["ratio"]: point for point in points}
        for point in sweeps.get(name, {}).get(tool, []):
            again = timed.get(point["ratio"])
            if "error" in point or again is None:
                continue
            if "error" in again:
                point["latency_error"] = again["error"]
            else:
                point.update(latency=again["latency"], original_latency=again["original_latency"])


def result_of(command: list[str], timeout: float) -> dict[str, Any]:
    """Run a benchmark's one-measurement mode in a fresh process, on ``THREADS`` threads: its ``RESULT`` line.

    A process that dies without one gives ``{"error": its last line on stderr}``;
    past ``timeout`` seconds it is stopped (subprocess.TimeoutExpired).
    """
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return {"error": tail[:200]}


def has_torch_pruning() -> bool:
    return importlib.util.find_spec("torch_pruning") is not None


def tools_for(name: str) -> tuple[str, ...]:
    """The original and prunereg; Torch-Pruning where installed, hand-configured too where its examples do."""
    if not has_torch_pruning():
        return (ORIGINAL, PRUNEREG)
    spec = MODELS[name]
    return tuple(t for t in TOOLS if (t != TP_HAND or spec.hand) and (t != TP_MLP or spec.attention_left_alone))


def unfinished(result: dict[str, Any]) -> bool:
    """A result the time budget cut short: a later run with the same --json reruns it."""
    return str(result.get("error", "")).startswith(SKIPPED)


def _works(result: dict[str, Any]) -> bool:
    """Ran, kept the output shapes, and left every attention head made of one original head's channels."""
    return "error" not in result and result.get("heads_whole") is not False


def sweep_tools(name: str, results: dict[str, dict[str, Any]]) -> list[str]:
    """prunereg, and the Torch-Pruning call that worked at the main ratio (hand-configured if it was needed)."""
    tools = [PRUNEREG]
    for tool in TORCH_PRUNING:
        if tool in results.get(name, {}) and _works(results[name][tool]):
            tools.append(tool)
            break
    return tools


# the report -----------------------------------------------------------------------------------------


def _count(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.2f}{suffix}"
    return f"{value:.0f}"


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _speedup(original: dict[str, Any], slimmed: dict[str, Any], key: str) -> float | None:
    """Against the original timed in turn in the slimmed model's process where it was, else in its own."""
    if key in slimmed and f"original_{key}" in slimmed:
        return slimmed[f"original_{key}"] / slimmed[key]
    if key in original and key in slimmed:
        return original[key] / slimmed[key]
    return None


def main_table(results: dict[str, dict[str, dict[str, Any]]], batches: tuple[int, int]) -> list[str]:
    big = batches[1]
    columns = [
        "model", "library", "parameters", "MACs", "latency, batch 1", "speed-up", f"latency, batch {big}",
        "speed-up", "slimming time", "warm", "peak memory", "heads whole", "hand configuration",
    ]  # fmt: skip
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name, by_tool in results.items():
        spec, original = MODELS[name], by_tool.get(ORIGINAL, {})
        for tool, result in by_tool.items():
            hand = {
                ORIGINAL: "-", PRUNEREG: "none", TP: "none", TP_HAND: spec.hand, TP_MLP: spec.attention_left_alone
            }[tool] or "-"  # fmt: skip
            if "error" in result:
                cells = [f"failed: `{result['error']}`", "", "", "", "", "", "", "", "", ""]
            else:
                cells = [
                    f"{_count(result['params'])} ({result['params'] / original.get('params', result['params']):.0%})",
                    _count(result["macs"]),
                ]
                for batch in batches:
                    key = f"latency_{batch}"
                    if key not in result:  # the latency process could not slim it again, or the budget ran out
                        cells += [f"failed: `{result.get('latency_error', 'not timed')}`", "-"]
                        continue
                    speed = _speedup(original, result, key) if tool != ORIGINAL else None
                    cells += [_seconds(result[key]), "-" if speed is None else f"x{speed:.2f}"]
                cells += [
                    _seconds(result["seconds"]) if "seconds" in result else "-",
                    _seconds(result["warm_seconds"]) if "warm_seconds" in result else "-",
                    f"{result['peak'] / 2**20:.0f} MiB" if "peak" in result else "-",
                    {True: "yes", False: "**no**", None: "-"}[result.get("heads_whole")],
                ]
            rows.append(f"| {spec.title} | {tool} | " + " | ".join([*cells, hand]) + " |")
    return rows


def targets_table(results: dict[str, dict[str, dict[str, Any]]], batches: tuple[int, int]) -> list[str]:
    """Issue 18's targets, model by model, against the Torch-Pruning call that worked (plain first)."""
    rows = ["| model | target | measured | met |", "|---|---|---|---|"]
    for name, by_tool in results.items():
        title, original, mine = MODELS[name].title, by_tool.get(ORIGINAL, {}), by_tool.get(PRUNEREG, {})
        works = PRUNEREG in by_tool and _works(mine)
        rows.append(
            f"| {title} | prunereg slims it without hand configuration | "
            f"{'yes' if works else mine.get('error', 'heads regrouped')} | {'yes' if works else 'no'} |"
        )
        theirs_tool = next((t for t in TORCH_PRUNING if t in by_tool and _works(by_tool[t])), None)
        if not works or theirs_tool is None or "params" not in original:
            continue
        theirs = by_tool[theirs_tool]
        removed_mine, removed_theirs = original["params"] - mine["params"], original["params"] - theirs["params"]
        rows.append(
            f"| {title} | parameters removed >= {theirs_tool}'s | {_count(removed_mine)} vs {_count(removed_theirs)} "
            f"| {'yes' if removed_mine >= removed_theirs else 'no'} |"
        )
        for batch in batches:
            key = f"latency_{batch}"
            mine_x, theirs_x = _speedup(original, mine, key), _speedup(original, theirs, key)
            if mine_x is not None and theirs_x is not None:
                rows.append(
                    f"| {title} | speed-up at batch {batch} within 10 % of {theirs_tool}'s | "
                    f"x{mine_x:.2f} vs x{theirs_x:.2f} | {'yes' if mine_x >= 0.9 * theirs_x else 'no'} |"
                )
        for key, what in (("seconds", "slimming time"), ("warm_seconds", "slimming time, warm")):
            if key in mine and key in theirs:
                rows.append(
                    f"| {title} | {what} <= {theirs_tool}'s | {_seconds(mine[key])} vs {_seconds(theirs[key])} "
                    f"| {'yes' if mine[key] <= theirs[key] else 'no'} |"
                )
    return rows


def sweep_table(sweeps: dict[str, dict[str, list[dict[str, Any]]]], results: dict[str, Any]) -> list[str]:
    rows = ["| model | library | ratio | parameters | latency, batch 1 | speed-up |", "|---|---|---|---|---|---|"]
    for name, by_tool in sweeps.items():
        unslimmed = results.get(name, {}).get(ORIGINAL, {}).get("latency_1")
        for tool, points in by_tool.items():
            for point in points:
                if "error" in point:
                    rows.append(
                        f"| {MODELS[name].title} | {tool} | {point['ratio'] or '-'} | failed: `{point['error']}` | | |"
                    )
                    continue
                if "latency" not in point:
                    rows.append(
                        f"| {MODELS[name].title} | {tool} | {point['ratio']:g} | {_count(point['params'])} | "
                        f"failed: `{point.get('latency_error', 'not timed')}` | |"
                    )
                    continue
                base = point.get("original_latency", unslimmed)  # the original timed in turn with the point
                speed = f"x{base / point['latency']:.2f}" if base else "-"
                rows.append(
                    f"| {MODELS[name].title} | {tool} | {point['ratio']:g} | {_count(point['params'])} | "
                    f"{_seconds(point['latency'])} | {speed} |"
                )
    return rows


def machine(before: str, after: str, packages: tuple[str, ...] = ("torch-pruning", "transformers")) -> str:
    """The provenance line: processor, threads, the versions of torch and ``packages``, the date, the load."""
    import torch

    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = f"torch {torch.__version__}"
    for package in packages:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions += f", {package} {importlib.metadata.version(package)}"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{cpu}, {os.cpu_count()} cores, {THREADS} threads; {versions}; Python {platform.python_version()}; "
        f"{date}; load average before / after {before} / {after}"
    )


def load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def report(
    results: dict[str, dict[str, dict[str, Any]]],
    sweeps: dict[str, dict[str, list[dict[str, Any]]]],
    about: str,
    quick: bool,
    image: str | None,
) -> str:
    batches = (1, 4) if quick else (1, 32)
    lines = [
        *(
            ["**--quick: tiny models (the titles name the full ones); a smoke test, not figures.**", ""]
            if quick
            else []
        ),
        f"`prunereg.slim(model, inputs, ratio={RATIO})` and Torch-Pruning at `pruning_ratio={RATIO}`, on models built",
        "from transformers configs with random weights, each (model, library) in a fresh process. *parameters*",
        "in per cent of the original; *MACs* of one forward at batch 1 (torch's FlopCounterMode, the same count",
        "for every library); latencies are medians of forwards under `torch.no_grad()` taken in turn in one more",
        "fresh process per model, which holds the original and every library's slimmed model (the sweep's too),",
        "the rounds going through every order of the models; speed-ups are against the original of those",
        "rounds (latencies of separate processes differ by more than the libraries do); *peak memory* is the",
        "resident high-water mark above the loaded model while slimming. *slimming time* is the first call in",
        "the process (with the library's imports and one-time starts; prunereg goes through torch.export, whose",
        "first call imports torch's compiler, only for the models docs/slimming.md lists); *warm*",
        "slims a second copy of the model in the same process. Torch-Pruning's plain call is its",
        "README's (`MagnitudePruner`, L2 importance, the output head in `ignored_layers`); the hand-configured",
        "rows add what its examples write for the model and,",
        "where that fails too, the configuration that runs.",
        "*heads whole*: whether each attention head of the slimmed model holds channels of one original head",
        "only (read back from the query/key biases, numbered before slimming); **no** means the library removed",
        "channels across heads and the model regroups the survivors into heads that never existed. The targets",
        "compare against the Torch-Pruning call that ran with heads whole.",
        *(
            []
            if has_torch_pruning()
            else ["**torch_pruning is not installed (the bench extra): its rows are left out.**"]
        ),
        "",
        *main_table(results, batches),
        "",
        "### Targets (issue 18)",
        "",
        *targets_table(results, batches),
        "",
    ]
    if sweeps:
        lines += [
            "### Latency against ratio",
            "",
            "Batch 1; Torch-Pruning as in the targets (hand-configured where its plain call failed or regrouped",
            "heads).",
            "",
            *([f"![latency at batch 1 against the slimming ratio](images/{image})", ""] if image else []),
            *sweep_table(sweeps, results),
            "",
        ]
    lines += [f"Measured on {about}. Reproduce: `python benchmarks/slim.py{' --quick' if quick else ''}`."]
    return "\n".join(lines)


def unrunnable(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """``model: error`` for each model whose original (unslimmed) row failed: built or run, not slimmed."""
    return [
        f"{name}: {by_tool[ORIGINAL]['error']}"
        for name, by_tool in results.items()
        if "error" in by_tool.get(ORIGINAL, {}) and not unfinished(by_tool[ORIGINAL])
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny models; print the section instead of writing it")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS), help="these models only")
    parser.add_argument("--output", type=Path, help=f"the page to write the section into (default {DEFAULT_OUTPUT})")
    parser.add_argument("--images", type=Path, help="where the plot goes (default: images/ beside the page)")
    parser.add_argument(
        "--budget", type=float, default=BUDGET, help="minutes the whole run may take; what is left then is skipped"
    )
    parser.add_argument(
        "--json", type=Path, help="keep the raw results here; what is in it already (not skipped) is not rerun"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(MODELS),
        help="rerun these models (all their rows and sweeps, even if --json has them); the report keeps "
        "every other model --json holds",
    )
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "LIBRARY"), help=argparse.SUPPRESS)
    parser.add_argument("--one-sweep", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--latency", nargs="+", metavar="MODEL TOOL", help=argparse.SUPPRESS)
    parser.add_argument("--swept", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one[0], args.one[1], args.quick, args.one_sweep)))
        return 0
    if args.latency:
        print("RESULT " + json.dumps(latency_one(args.latency[0], args.latency[1:], args.swept, args.quick)))
        return 0
    before, started = load(), time.perf_counter()
    stored = json.loads(args.json.read_text()) if args.json and args.json.exists() else {}
    results: dict[str, dict[str, dict[str, Any]]] = stored.get("results", {})
    sweeps: dict[str, dict[str, list[dict[str, Any]]]] = stored.get("sweeps", {})
    reused = 0
    if args.only:  # rerun these afresh; report them with whatever else the file holds, in the usual order
        for name in args.only:
            results.pop(name, None)
            sweeps.pop(name, None)
        args.models = [name for name in MODELS if name in args.only or name in results]

    def left() -> float:
        return args.budget * 60 - (time.perf_counter() - started)

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps({"results": results, "sweeps": sweeps}, indent=1) + "\n")

    def skipped() -> str:
        return f"{SKIPPED} the run's {args.budget:g} minutes were spent"

    for name in args.only or args.models:
        for tool in tools_for(name):
            if tool in results.get(name, {}) and not unfinished(results[name][tool]):
                reused += 1
                continue
            print(f"{name} [{tool}] ...", end=" ", flush=True, file=sys.stderr)
            results.setdefault(name, {})[tool] = (
                run_in_subprocess(name, tool, args.quick, timeout=min(PROCESS_TIMEOUT, left()))
                if left() > MINIMUM_LEFT
                else {"error": skipped()}
            )
            save()
            print(results[name][tool].get("error", "done"), f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        for tool in sweep_tools(name, results) if name in SWEEP_MODELS else []:
            points = sweeps.get(name, {}).get(tool, [])
            if points and not any(unfinished(point) for point in points):
                reused += 1
                continue
            print(f"{name} [{tool}] ratio sweep ...", end=" ", flush=True, file=sys.stderr)
            if left() <= MINIMUM_LEFT:
                print(skipped(), file=sys.stderr)
                continue
            swept = run_in_subprocess(name, tool, args.quick, sweep=True, timeout=min(PROCESS_TIMEOUT, left()))
            sweeps.setdefault(name, {})[tool] = swept.get("sweep", [{"ratio": None, "error": swept.get("error")}])
            save()
            print(f"done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        if needs_latency(name, results, sweeps):
            print(f"{name} latencies, in turn ...", end=" ", flush=True, file=sys.stderr)
            if left() <= MINIMUM_LEFT:
                for result in results[name].values():
                    result.setdefault("latency_error", skipped())
                print(skipped(), file=sys.stderr)
                continue
            add_latencies(name, results, sweeps, args.quick, min(PROCESS_TIMEOUT, left()))
            save()
            print(f"done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    results = {n: {t: results[n][t] for t in TOOLS if t in results[n]} for n in args.models if n in results}
    sweeps = {n: sweeps[n] for n in SWEEP_MODELS if n in sweeps and n in args.models}
    about = machine(before, load()) + f"; the run took {(time.perf_counter() - started) / 60:.1f} min"
    if reused:
        about += f" ({reused} results kept from an earlier run in {args.json.name if args.json else '?'})"
    output = args.output or (None if args.quick else DEFAULT_OUTPUT)
    drawable = importlib.util.find_spec("matplotlib") is not None
    image = IMAGE if sweeps and output is not None and drawable else None
    if sweeps and output is not None and not drawable:
        print("no plot: it needs matplotlib (the bench extra)", file=sys.stderr)
    text = report(results, sweeps, about, args.quick, image)
    if output is None:
        print(text)
        return 0
    unbuilt = unrunnable(results)
    if unbuilt:  # the environment's failure, not a library's: a page written now would hide the rows
        print(f"not written: the original model did not run: {'; '.join(unbuilt)}", file=sys.stderr)
        return 1
    replace_between(output, MARKER, text, HEADING)
    print(f"wrote the slimming section of {output}", file=sys.stderr)
    if image is not None:  # drawn from the page just written, as benchmarks/plots.py redraws it later
        import plots

        markdown = output.read_text()
        plots.draw_slim_latency(plots.tables(markdown), markdown, (args.images or output.parent / "images") / image)
    return 0


if __name__ == "__main__":
    sys.exit(main())
