"""benchmarks/slim_zoo_peer.py: each (model, library) measured and classified, the zoo section written from them."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "benchmarks"))

import slim  # noqa: E402  (benchmarks/ is not a package: found through sys.path)
import slim_zoo  # noqa: E402
import slim_zoo_peer as peer  # noqa: E402


def _mlp() -> slim_zoo.Built:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3)).eval(), (
        torch.randn(1, 8),
    )


class _Tokens(nn.Module):
    """A class token of the model's own (as in ViT), added before the body and the head run."""

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.zeros(4))
        self.body, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x + self.token))


@pytest.fixture
def plain_zoo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The zoo holding one plain torch model, ``mlp``; torch's thread count put back after run_one sets it."""
    monkeypatch.setitem(slim_zoo.ZOO, "mlp", _mlp)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_the_output_head_is_the_last_module_with_parameters_to_start_in_a_forward() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16, 5), nn.ReLU(), nn.Dropout())
    assert peer.output_head(model, (torch.randn(1, 3, 4, 4),)) == "3"
    assert peer.output_head(_Tokens(), (torch.randn(1, 4),)) == "head"  # not the model, which holds the token
    with pytest.raises(ValueError, match="Sequential runs no module with parameters"):
        peer.output_head(nn.Sequential(nn.ReLU()), (torch.randn(1, 4),))


@pytest.mark.parametrize(
    ("name", "package", "head"),
    [
        ("hf_llama", "transformers", "lm_head"),
        ("timm_vit_tiny", "timm", "head"),
        ("squeezenet1_1", "torchvision", "classifier.1"),
    ],
)
def test_the_output_head_of_zoo_models_where_their_zoo_is_installed(name: str, package: str, head: str) -> None:
    pytest.importorskip(package)
    torch.manual_seed(0)
    model, inputs = slim_zoo.ZOO[name]()
    assert peer.output_head(model, inputs) == head


def test_prunereg_on_a_plain_model_is_measured_and_checked(plain_zoo: None) -> None:
    result = peer.run_one("mlp", slim.PRUNEREG, 60)
    assert result["status"] == peer.OK and result["head"] == "4"
    assert result["params_before"] == 8 * 32 + 32 + 32 * 32 + 32 + 32 * 3 + 3
    assert 0 < result["params"] < result["params_before"] and 0 < result["macs"] < result["macs_before"]
    assert result["seconds"] > 0 and result["warm_seconds"] > 0 and "peak" in result
    assert result["no_op"] == "ok" and result["masked"].startswith("ok (")
    assert "latency_1" not in result  # timed with the other libraries' models, in their own process


def test_the_original_and_every_librarys_slimmed_model_are_timed_in_one_process_at_both_batches(
    plain_zoo: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(slim.SLIMMERS, slim.TP, _loops)  # a library that hangs here has no latencies, and says why
    found = peer.latency_one("mlp", [slim.PRUNEREG, slim.TP], 1)
    assert found[slim.TP] == {"latency_error": "SlimTimeout: did not finish in 1 s (stopped)"}
    timed = found[slim.PRUNEREG]
    assert sorted(timed) == ["latency_1", "latency_32", "original_latency_1", "original_latency_32"]
    assert all(seconds > 0 for seconds in timed.values())


def test_latencies_are_added_once_for_the_libraries_that_slimmed_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []

    def timed(name: str, libraries: list[str], timeout: int) -> dict[str, dict[str, Any]]:
        asked.append(libraries)
        return {library: {"original_latency_1": 2.0, "latency_1": 1.0} for library in libraries}

    monkeypatch.setattr(peer, "latency_in_subprocess", timed)
    results = {"m": {slim.PRUNEREG: {"status": peer.OK}, slim.TP: {"status": peer.HUNG, "said": "stopped"}}}
    peer.add_latencies(results, "m", 60)
    peer.add_latencies(results, "m", 60)  # timed already: no second process
    assert asked == [[slim.PRUNEREG]]
    assert peer.speed_up(results["m"][slim.PRUNEREG]) == 2.0 and "latency_1" not in results["m"][slim.TP]


def test_torch_pruning_on_a_plain_model_keeps_the_head(plain_zoo: None) -> None:
    pytest.importorskip("torch_pruning", reason="the bench extra")
    result = peer.run_one("mlp", slim.TP, 60)
    assert result["status"] == peer.OK and result["params"] < result["params_before"]
    assert "no_op" not in result and "masked" not in result  # prunereg's checks only


def _loops(*_: Any) -> None:
    while True:
        pass


def _raises(*_: Any) -> None:
    raise RuntimeError("cannot trace this model\nsecond line")


def _narrows_the_head(model: Any, *_: Any) -> None:
    model[4] = nn.Linear(32, 2)


@pytest.mark.parametrize(
    ("slimmer", "status", "said"),
    [
        (_raises, peer.REFUSED, "RuntimeError: cannot trace this model"),
        (_loops, peer.HUNG, "SlimTimeout: did not finish in 1 s (stopped)"),
        (_narrows_the_head, peer.BROKEN, "output shapes changed: [torch.Size([1, 3])] -> [torch.Size([1, 2])]"),
    ],
)
def test_a_library_that_raises_hangs_or_breaks_the_model_is_reported_so(
    plain_zoo: None, monkeypatch: pytest.MonkeyPatch, slimmer: Callable[..., None], status: str, said: str
) -> None:
    monkeypatch.setitem(slim.SLIMMERS, slim.TP, slimmer)
    result = peer.run_one("mlp", slim.TP, 1)
    assert (result["status"], result["said"]) == (status, said)
    assert "params" not in result and result["params_before"] > 0


def _ok(params: int, seconds: float, speed: float, **checks: str) -> dict[str, Any]:
    return {
        "status": peer.OK, "params_before": 1000, "params": params, "macs_before": 4000, "macs": 2000,
        "original_latency_1": speed, "latency_1": 1.0, "original_latency_32": 2 * speed, "latency_32": 1.0,
        "seconds": seconds, "warm_seconds": seconds / 10,
        "peak": 2**20, **checks,
    }  # fmt: skip


CHECKED = {"no_op": "ok", "masked": "ok (fc.weight: 4 removed)"}
RESULTS = {
    "resnet18": {slim.PRUNEREG: _ok(400, 2.0, 2.0, **CHECKED), slim.TP: _ok(500, 1.0, 2.0)},
    "hf_llama": {slim.PRUNEREG: _ok(600, 0.5, 1.5, **CHECKED), slim.TP: _ok(500, 0.1, 1.0)},
    "swin_t": {
        slim.PRUNEREG: _ok(500, 4.0, 1.2, no_op="ok", masked="DIFFERENT"),
        slim.TP: {"status": peer.HUNG, "said": "SlimTimeout: did not finish in 120 s (stopped)"},
    },
    "vit_b_16": {
        slim.PRUNEREG: {"status": peer.REFUSED, "said": "SlimError: cannot slim"},
        slim.TP: _ok(500, 0.3, 1.1),
    },
}


def _row(text: str, *cells: str) -> str:
    start = "| " + " | ".join(cells) + " |"
    return next(line for line in text.splitlines() if line.startswith(start))


def test_the_report_counts_compares_and_judges_the_targets() -> None:
    text = peer.report(RESULTS, peer.LIBRARIES, "a test machine")
    row = ("resnet18", "prunereg", "ok", "400 (40%)", "2.00k (50%)", "x2.00", "x4.00", "2.00 s", "200.0 ms", "1 MiB")
    assert _row(text, *row)
    assert _row(text, "swin_t", "Torch-Pruning", "hung: `SlimTimeout: did not finish in 120 s (stopped)`")
    assert _row(text, "ok", "3", "3") and _row(text, "hung", "0", "1") and _row(text, "refused", "1", "0")
    # resnet18 and hf_llama both slim: medians of (2.0, 0.5) against (1.0, 0.1), speed-ups (2.0, 1.5) against (2.0, 1.0)
    assert _row(text, "median slimming time, the 2 models all slim", "1.25 s", "550.0 ms")
    assert _row(text, "median slimming time, every model each slims", "2.00 s (3)", "300.0 ms (3)")
    assert _row(text, "median speed-up, batch 1, the 2 models all slim", "x1.75", "x1.50")
    assert _row(text, "median speed-up, batch 32, the 2 models all slim", "x3.50", "x3.00")
    assert "prunereg removes fewer parameters than Torch-Pruning on: hf_llama." in text
    assert _row(text, "6", "every model slims at `ratio=0.5` with no hand configuration", "3 of 4", "**no**")
    assert _row(text, "6", "no-op on every model", "3 of 4", "**no**")
    assert _row(text, "6", "masked equality on every model", "2 of 4", "**no**")
    fewer = "parameters removed no fewer than Torch-Pruning's where both work"
    assert _row(text, "6", fewer, "fewer on 1 of 2: hf_llama", "**no**")
    assert _row(text, "6", "median batch-1 speed-up within 5% of Torch-Pruning's (the models both slim)").endswith(
        "| x1.75 vs x1.50 | yes |"
    )
    assert _row(text, "3", "median slimming time no slower than Torch-Pruning's (the models both slim)").endswith(
        "| 1.25 s vs 550.0 ms | **no** |"
    )
    few = ", ".join(peer.FEW_LAYERS)
    assert _row(text, "3", f"under 1 s on a model of a few layers ({few}), first call", "slowest 500.0 ms", "yes")
    assert text.endswith("Measured on a test machine.")


def test_without_torch_pruning_the_report_has_prunereg_alone_and_leaves_its_comparisons_unjudged() -> None:
    mine = {name: {slim.PRUNEREG: by[slim.PRUNEREG]} for name, by in RESULTS.items()}
    text = peer.report(mine, (slim.PRUNEREG,), "a test machine")
    assert "Torch-Pruning did not run (not installed)" in text and "| | prunereg |" in text
    assert _row(text, "6", "parameters removed no fewer than Torch-Pruning's where both work", "fewer on 0 of 0", "-")
    assert not [line for line in text.splitlines() if "all slim" in line]


@pytest.mark.slow  # a fresh process builds and slims a 2-block GPT-2 (transformers, the dev extra)
def test_a_run_writes_its_section_from_fresh_processes_and_leaves_the_rest_of_the_page(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    page, raw = tmp_path / "benchmarks.md", tmp_path / "zoo.json"
    others = "# Benchmarks\n\n## Targets\n\nwritten by run.py\n"
    page.write_text(f"{others}\n{peer.HEADING}\n\n<!-- {peer.MARKER} -->\nstale\n<!-- /{peer.MARKER} -->\n\n## After\n")
    arguments = ["--models", "hf_gpt2", "--libraries", slim.PRUNEREG, "--output", str(page), "--json", str(raw)]
    assert peer.main(arguments) == 0
    text = page.read_text()
    assert text.startswith(others) and text.endswith("\n## After\n") and "stale" not in text
    row = _row(text, "hf_gpt2", "prunereg", "ok")
    assert "`ok (transformer.h." in row
    assert all(cell.startswith("x") for cell in row.split(" | ")[5:7])  # speed-ups at batch 1 and 32, from one process
    assert "Reproduce: `python benchmarks/slim_zoo_peer.py --models hf_gpt2`" in text
    assert peer.main(arguments) == 0  # the JSON file holds the result: kept, not rerun
    assert "(1 results kept from an earlier run in zoo.json)" in page.read_text()
