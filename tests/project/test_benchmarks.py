"""The benchmark runner still runs: one small case end to end, in its own processes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_run_writes_a_report(tmp_path: Path) -> None:
    output = tmp_path / "benchmarks.md"
    kept = "## One-shot timings\n\n<!-- llm-time -->\n| written by benchmarks/llm.py |\n<!-- /llm-time -->\n"
    output.write_text("# Benchmarks\n\n## An old table\n\nreplaced\n\n" + kept)
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "run.py"),
            "--quick",
            "--only",
            "compute_mask/l1_unstructured/float32",
            "--output",
            str(output),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = output.read_text()
    row = next(line for line in report.splitlines() if line.startswith("| l1_unstructured float32 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "512x512"
    for cell in cells[2:4]:  # both libraries timed, in the unit that reads best (a fast machine: microseconds)
        assert re.fullmatch(r"[\d.]+ (us|ms|s)", cell), cell
    assert cells[4].endswith("x")
    assert "| torch | " in report and "load average" in report
    assert report.endswith("\n" + kept)  # another script's section survives, still last
    assert "## An old table\n\nreplaced" in report  # --only keeps the sections it did not measure


@pytest.mark.slow
def test_quick_size_sweep_writes_its_table(tmp_path: Path) -> None:
    output = tmp_path / "benchmarks.md"
    sweep = "sizes/l1_unstructured/float32"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--only", sweep, "--output", str(output)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = output.read_text()
    section = report[report.index("## compute_mask against tensor size") :]
    rows = [line for line in section.splitlines() if line.startswith("| l1_unstructured float32 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["256", "4096", "65536"]  # entries, small to large
    assert all(row.rstrip(" |").endswith("x") for row in rows)  # both libraries timed: a speed-up each
    assert "![prunereg's speed-up over torch" in report


@pytest.mark.slow
def test_quick_small_layers_case_times_both_libraries_for_every_call(tmp_path: Path) -> None:
    output = tmp_path / "benchmarks.md"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "run.py"),
            "--quick",
            "--only",
            "small_layers",
            "--output",
            str(output),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = output.read_text()
    section = report[report.index("## Many small layers, one call each") :]
    rows = [line for line in section.splitlines() if line.startswith("| ") and line.rstrip(" |").endswith("x")]
    calls = [row.split("|")[1].strip() for row in rows]
    assert calls == ["l1_unstructured", "l1_unstructured again", "ln_structured", "prune then remove"]
    assert "on many small layers no slower per call than torch" in report  # a target row per call
    assert re.search(r"^Measured \S+ \S+ UTC on .+; torch \S+; commit \w+\.$", report, re.MULTILINE)  # the run


# Sections whose rows come from several runs (each row's run is its section's) or that hold no figure.
_UNSTAMPED = {"Targets", "At a glance"}


@pytest.mark.parametrize("page", ["docs/benchmarks.md", "docs/llm.md"])
def test_every_measured_table_names_the_machine_and_run_that_measured_it(page: str) -> None:
    """A partial rerun replaces some sections only: each says which run (machine, date) its figures are from."""
    text = (ROOT / page).read_text()
    for section in re.split(r"\n(?=## )", text)[1:]:
        heading = section.splitlines()[0][3:]
        measured = re.search(r"^\| .*\d.* \|$", section, re.MULTILINE) and heading not in _UNSTAMPED
        if (measured and page == "docs/benchmarks.md") or re.search(r"<!-- (quality|shrink-measured) -->", section):
            assert re.search(r"^Measured .*\d{4}-\d\d-\d\d.*$", section, re.MULTILINE), f"{page}: {heading}"
            processor = r"AMD EPYC|Intel|Xeon|x86_64|x86-64|aarch64"
            assert re.search(processor, section), f"{page}: {heading} names no processor"


def test_a_partial_run_stamps_the_sections_it_measured() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import run  # benchmarks/ is not a package

    info = {"cpu": "Test CPU, 2 cores, torch uses 2 threads", "torch": "2.13.0", "commit": "abc1234", "date": "D"}
    assert run.stamped([], info) == []
    assert run.stamped(["## A", "", "| x |"], info)[-2] == (
        "Measured D on Test CPU, 2 cores, torch uses 2 threads; torch 2.13.0; commit abc1234."
    )
