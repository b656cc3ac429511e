"""benchmarks/run.py --only: the sections it ran replace theirs on the page, every other section stays."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "benchmarks"))

import run  # noqa: E402  (benchmarks/ is not a package: found through sys.path)

OLD = """# Benchmarks

| machine | |
|---|---|
| date | old run |

## Targets

| target | measured | met |
|---|---|---|
| `compute_mask` fast | 10x | yes |
| `ln_structured` on many small layers no slower per call than torch | 1.24x torch's time | no |

## compute_mask, amount 0.5

| method | time |
|---|---|
| l1 | 1 ms |

## Many small layers, one call each

| call | prunereg / torch |
|---|---|
| ln_structured | 1.24x |

## One-shot pruning

<!-- llm-time -->
| written by benchmarks/llm.py |
<!-- /llm-time -->
"""

NEW = """# Benchmarks

| machine | |
|---|---|
| date | new run |

## Targets

| target | measured | met |
|---|---|---|
| `ln_structured` on many small layers no slower per call than torch | 0.95x torch's time | yes |
| `busy` keeps its speed-up | 3x | yes |

## Many small layers, one call each

| call | prunereg / torch |
|---|---|
| ln_structured | 0.95x |

## compute_mask beside a busy process

| case | busy / alone |
|---|---|
| l1 | 1.1x |
"""


def test_a_partial_run_replaces_only_the_sections_it_measured() -> None:
    page = run.merge(OLD, NEW)
    assert "| date | new run |" in page and "old run" not in page  # the header is the run's
    assert "| l1 | 1 ms |" in page  # a section the run did not measure stays as it was
    assert "| ln_structured | 0.95x |" in page and "1.24x" not in page  # one it measured is replaced
    assert page.endswith("<!-- llm-time -->\n| written by benchmarks/llm.py |\n<!-- /llm-time -->\n")


def test_a_partial_run_keeps_the_order_of_the_page_and_adds_new_sections_before_other_scripts() -> None:
    headings = [line for line in run.merge(OLD, NEW).splitlines() if line.startswith("## ")]
    assert headings == [
        "## Targets",
        "## compute_mask, amount 0.5",
        "## Many small layers, one call each",
        "## compute_mask beside a busy process",
        "## One-shot pruning",
    ]


def test_a_partial_run_merges_the_targets_row_by_row() -> None:
    page = run.merge(OLD, NEW)
    targets = page.split("## Targets\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert targets == [
        "| target | measured | met |",
        "|---|---|---|",
        "| `compute_mask` fast | 10x | yes |",
        "| `ln_structured` on many small layers no slower per call than torch | 0.95x torch's time | yes |",
        "| `busy` keeps its speed-up | 3x | yes |",
    ]


def test_merging_a_page_with_its_own_report_changes_nothing() -> None:
    assert run.merge(OLD, OLD) == OLD
