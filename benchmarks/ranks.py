"""Calibration and solves split over ranks: SmolLM2-135M on 2 gloo ranks against one process, per method.

    python benchmarks/ranks.py                    # every row, a markdown table on stdout
    python benchmarks/ranks.py --only sparsegpt   # some methods
    python benchmarks/ranks.py --quick            # a tiny Llama from a config: checks the script runs

The protocol is ``benchmarks/llm.py``'s (SmolLM2-135M as float32, calibration on
the first 64 x 256 tokens of Coriolanus). Each method runs three ways, each in
fresh processes: one process at one thread, one process at two threads, and
two ranks of one thread each (``torchrun --standalone --nproc-per-node 2``, gloo:
each rank calibrates on half the batches and solves its share of each block's
groups). A row gives the wall time of the call (the slowest rank's), the peak
resident memory of each rank during it, the time the one-shot engine spent in
its solves (the slowest rank's ``timings.pruning``) and the speed-up against the
one process at two threads: the issue's target is 2 ranks at one thread each no
slower than that. On ranks, every exchange between them is counted: before it, a
barrier waits for the slowest rank (``waiting``: the ranks' imbalance, not
communication), then the exchange itself is timed with its serialization
(``communication``, the slowest rank's, and its share of the call) and its bytes
(what this rank sends; every rank receives every rank's: small exchanges are an
``all_gather_object``, the statistics and the solves' results one broadcast per
source rank after an exchange of their sizes). Every rank's model is checked to be the same bits as the
one process's at one thread (the ``bits`` column; at two threads torch's kernels
may round differently: the ranks equal one process at the same thread count).

``wanda`` and ``sparsegpt`` are ``prunereg.oneshot`` at 50 %; ``flap`` is
``prunereg.shrink`` at mlp 0.5; ``flap+refit`` the same with ``recover="refit"``;
``wanda+refit`` is ``prunereg.recover(..., "refit")`` of a Wanda-pruned model
(pruned before the clock starts), the masked refit whose row solves are split.
Timings need a quiet machine: the figures of a shared one mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import llm  # benchmarks/llm.py: the data, the model
import memory  # benchmarks/memory.py
import shrink  # benchmarks/shrink.py: the tiny model of --quick

METHODS = ("wanda", "sparsegpt", "flap", "flap+refit", "wanda+refit")
#: How each method runs: (ranks, threads per rank).
LAYOUTS = {"1 process, 1 thread": (1, 1), "1 process, 2 threads": (1, 2), "2 ranks, 1 thread each": (2, 1)}
BASELINE = "1 process, 2 threads"
SAME_THREADS = "1 process, 1 thread"  # what the ranks must equal bit for bit


def _call(method: str, model: Any, calibration: Any) -> Callable[[], Any]:
    """The timed call of ``method`` on ``model`` (any untimed preparation done first)."""
    import prunereg

    if method in ("wanda", "sparsegpt"):
        return lambda: prunereg.oneshot(model, method, calibration=calibration, sparsity=0.5, progress=False)
    if method in ("flap", "flap+refit"):
        recover = {"recover": "refit"} if method == "flap+refit" else {}
        return lambda: prunereg.shrink(model, "flap", calibration, mlp=0.5, progress=False, **recover)
    teacher = copy.deepcopy(model)
    prunereg.oneshot(model, "wanda", calibration=calibration, sparsity=0.5, progress=False)
    return lambda: prunereg.recover(model, teacher, calibration, "refit", progress=False)


@contextlib.contextmanager
def counted_exchanges() -> Iterator[dict[str, float]]:
    """Count the exchanges between ranks while inside: seconds waiting, seconds communicating, bytes sent.

    Every collective of the engines is a ``Ranks.exchange``, or a
    ``Ranks._each_loaded`` (an exchange of sizes, then a broadcast from each
    rank: the bytes sent are this rank's broadcast); a barrier before each
    separates the wait for the slowest rank from the exchange itself. (The
    benchmark's own instrument: it reaches into the runtime's private ``Ranks``.)
    """
    import torch.distributed as dist

    from prunereg._runtime.ranks import Ranks

    totals = {"waiting": 0.0, "communication": 0.0, "bytes": 0.0, "exchanges": 0.0}
    depth = [0]
    originals = {name: getattr(Ranks, name) for name in ("exchange", "_each_loaded")}
    broadcast = dist.broadcast

    def counted_broadcast(tensor: Any, src: int, *args: Any, **kwargs: Any) -> Any:
        if depth[0] and src == dist.get_rank():
            totals["bytes"] += tensor.numel() * tensor.element_size()
        return broadcast(tensor, src, *args, **kwargs)

    def counted(name: str) -> Callable[..., Any]:
        original = originals[name]

        def exchange(self: Ranks, payload: Any, *args: Any, **kwargs: Any) -> Any:
            if depth[0]:
                return original(self, payload, *args, **kwargs)
            start = time.perf_counter()
            dist.barrier()
            ready = time.perf_counter()
            depth[0] += 1
            try:
                return original(self, payload, *args, **kwargs)
            finally:
                depth[0] -= 1
                totals["waiting"] += ready - start
                totals["communication"] += time.perf_counter() - ready
                totals["exchanges"] += 1

        return exchange

    for name in originals:
        setattr(Ranks, name, counted(name))
    dist.broadcast = counted_broadcast
    try:
        yield totals
    finally:
        for name, original in originals.items():
            setattr(Ranks, name, original)
        dist.broadcast = broadcast


def run_one(method: str, cache: Path, threads: int, quick: bool) -> dict[str, Any]:
    """Run ``method`` in this process (a rank of a process group where ``torchrun`` started it): what it measured."""
    import torch
    import torch.distributed as dist

    from prunereg._runtime.ranks import launched_group

    torch.set_num_threads(threads)
    with launched_group(None):  # the group the commands start under torchrun, the same way
        model, calibration, _ = shrink.quick_data() if quick else llm.load(cache)
        call = _call(method, model, calibration)
        if dist.is_initialized():
            dist.barrier()  # every rank starts the clock together
        memory.trim()
        memory.reset_peak()
        with counted_exchanges() if dist.is_initialized() else contextlib.nullcontext({}) as exchanges:
            start = time.perf_counter()
            report = call()
            seconds = time.perf_counter() - start
    timings = getattr(report, "timings", None)
    return {
        "seconds": seconds,
        "peak_rss": memory.peak(),
        "solves": getattr(timings, "pruning", None),
        "state": _state_digest(model),
        "exchanges": dict(exchanges),
    }


def _state_digest(model: Any) -> str:
    hashed = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        hashed.update(name.encode())
        hashed.update(tensor.detach().contiguous().reshape(-1).view(-1).cpu().numpy().tobytes())
    return hashed.hexdigest()[:12]


def run_layout(method: str, layout: str, cache: Path, quick: bool) -> list[dict[str, Any]]:
    """``method`` in fresh processes as ``layout`` says: each rank's results, in rank order."""
    ranks, threads = LAYOUTS[layout]
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result"
        script = [str(Path(__file__).resolve()), "--one", method, "--threads", str(threads), "--cache", str(cache)]
        script += ["--out", str(out)] + (["--quick"] if quick else [])
        launcher = [sys.executable]
        if ranks > 1:
            launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        subprocess.run([*launcher, *script], check=True, env=env, timeout=3600)
        return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(ranks)]


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """The markdown table of every method's layouts."""
    lines = [
        "| method | layout | wall s | peak RSS per rank (MiB) | solves s | speed-up vs 1 process, 2 threads | bits "
        "| communication s (share) | waiting s | MiB sent per rank |",
        "| --- | --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for method, layouts in results.items():
        baseline = max(rank["seconds"] for rank in layouts[BASELINE]) if BASELINE in layouts else None
        reference = layouts[SAME_THREADS][0]["state"] if SAME_THREADS in layouts else None
        for layout, ranks in layouts.items():
            seconds = max(rank["seconds"] for rank in ranks)
            peaks = ", ".join(f"{rank['peak_rss'] / 2**20:.0f}" for rank in ranks)
            solves = [rank["solves"] for rank in ranks if rank["solves"] is not None]
            solved = f"{max(solves):.1f}" if solves else "-"
            speedup = f"{baseline / seconds:.2f}x" if baseline else "-"
            same = "as 1 thread" if all(rank["state"] == reference for rank in ranks) else "differ"
            same = "-" if reference is None else same
            lines.append(
                f"| {method} | {layout} | {seconds:.1f} | {peaks} | {solved} | {speedup} | {same} "
                f"| {_exchanged(ranks, seconds)} |"
            )
    return "\n".join(lines)


def _exchanged(ranks: list[dict[str, Any]], seconds: float) -> str:
    """The exchange columns: the slowest rank's communication and waiting, the most a rank sent ("-": one process)."""
    counted = [rank["exchanges"] for rank in ranks if rank.get("exchanges")]
    if not counted:
        return "- | - | -"
    communication = max(rank["communication"] for rank in counted)
    waiting = max(rank["waiting"] for rank in counted)
    sent = max(rank["bytes"] for rank in counted) / 2**20
    return f"{communication:.2f} ({communication / seconds:.1%}) | {waiting:.1f} | {sent:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=METHODS, help="run these methods only")
    parser.add_argument("--cache", type=Path, default=llm.cache_dir(), help="where the model and texts are kept")
    parser.add_argument("--quick", action="store_true", help="a tiny model from a config: checks the script runs")
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, help="run these layouts only (default: all three)")
    parser.add_argument("--json", type=Path, help="keep the raw results here")
    parser.add_argument("--one", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        result = run_one(args.one, args.cache, args.threads, args.quick)
        Path(f"{args.out}.{os.environ.get('RANK', '0')}").write_text(json.dumps(result))
        return
    if not args.quick:
        llm.prepare(args.cache)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for method in args.only or METHODS:
        layouts = args.layouts or LAYOUTS
        results[method] = {layout: run_layout(method, layout, args.cache, args.quick) for layout in layouts}
        print(f"{method}: {json.dumps(results[method])}", file=sys.stderr, flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    print(table(results))


if __name__ == "__main__":
    main()
