"""benchmarks/slim.py: its report reads its results right, and its --quick run writes its section and plot."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "benchmarks"))

import run  # noqa: E402  (benchmarks/ is not a package: found through sys.path)
import slim  # noqa: E402

HAS_TORCH_PRUNING = importlib.util.find_spec("torch_pruning") is not None

ORIGINAL = {"params": 1000, "macs": 4000, "latency_1": 0.2, "latency_32": 4.0}
MINE = {"params": 300, "macs": 1000, "latency_1": 0.05, "latency_32": 1.0, "seconds": 1.0, "peak": 2**20}
THEIRS = {"params": 400, "macs": 1100, "latency_1": 0.05, "latency_32": 1.2, "seconds": 2.0, "peak": 2**20}


def _row(report: str, *cells: str) -> str:
    start = "| " + " | ".join(cells) + " |"
    return next(line for line in report.splitlines() if line.startswith(start))


def test_the_targets_compare_with_the_torch_pruning_call_that_worked() -> None:
    results = {
        "resnet50": {slim.ORIGINAL: ORIGINAL, slim.PRUNEREG: MINE, slim.TP: THEIRS},
        "llama": {
            slim.ORIGINAL: ORIGINAL,
            slim.PRUNEREG: MINE,
            slim.TP: {"error": "AttributeError: 'tuple' object has no attribute 'grad_fn'"},
            slim.TP_HAND: {**THEIRS, "latency_1": 0.04},
        },
    }
    text = slim.report(results, {}, "a test machine", quick=False, image=None)
    resnet, llama = slim.MODELS["resnet50"].title, slim.MODELS["llama"].title
    assert _row(text, resnet, "parameters removed >= Torch-Pruning's").endswith("| 700 vs 600 | yes |")
    assert _row(text, resnet, "speed-up at batch 32 within 10 % of Torch-Pruning's").endswith("x4.00 vs x3.33 | yes |")
    assert _row(text, resnet, "slimming time <= Torch-Pruning's").endswith("| yes |")
    # the plain call failed on the Llama: the targets hold prunereg to the hand-configured one
    assert _row(text, llama, "speed-up at batch 1 within 10 % of Torch-Pruning, hand-configured's").endswith(
        "x4.00 vs x5.00 | no |"
    )
    assert "failed: `AttributeError: 'tuple' object has no attribute 'grad_fn'`" in _row(text, llama, "Torch-Pruning")
    assert _row(text, resnet, "prunereg").startswith(f"| {resnet} | prunereg | 300 (30%) | 1.00k | 50.0 ms | x4.00 |")


def test_the_warm_slimming_time_is_reported_and_compared_beside_the_first_call() -> None:
    """The first call in a process pays imports and torch.export's one-time start; the warm one does not."""
    results = {
        "resnet50": {
            slim.ORIGINAL: ORIGINAL,
            slim.PRUNEREG: {**MINE, "warm_seconds": 0.1},
            slim.TP: {**THEIRS, "warm_seconds": 0.2},
        },
        "cnn": {slim.ORIGINAL: ORIGINAL, slim.PRUNEREG: MINE, slim.TP: THEIRS},  # a JSON file from before: no warm
    }
    text = slim.report(results, {}, "a test machine", quick=False, image=None)
    resnet, cnn = slim.MODELS["resnet50"].title, slim.MODELS["cnn"].title
    assert _row(text, resnet, "slimming time, warm <= Torch-Pruning's").endswith("| 100.0 ms vs 200.0 ms | yes |")
    assert _row(text, resnet, "slimming time <= Torch-Pruning's").endswith("| 1.00 s vs 2.00 s | yes |")
    assert "| 1.00 s | 100.0 ms | 1 MiB |" in _row(text, resnet, "prunereg")
    assert "| 1.00 s | - | 1 MiB |" in _row(text, cnn, "prunereg")
    assert not [line for line in text.splitlines() if line.startswith(f"| {cnn} | slimming time, warm")]


def test_a_ratio_sweep_uses_the_torch_pruning_call_that_worked_at_the_main_ratio() -> None:
    results = {
        "llama": {slim.TP: {"error": "hangs"}, slim.TP_HAND: THEIRS},
        "resnet50": {slim.TP: THEIRS},
        "vit": {slim.TP: {"error": "fails"}, slim.TP_HAND: {"error": "fails too"}},
    }
    assert slim.sweep_tools("llama", results) == [slim.PRUNEREG, slim.TP_HAND]
    assert slim.sweep_tools("resnet50", results) == [slim.PRUNEREG, slim.TP]
    assert slim.sweep_tools("vit", results) == [slim.PRUNEREG]
    results["llama"][slim.TP_HAND] = {"error": "SlimTimeout: did not finish in 60 s (stopped)"}
    results["llama"][slim.TP_MLP] = THEIRS
    assert slim.sweep_tools("llama", results) == [slim.PRUNEREG, slim.TP_MLP]


def test_torch_pruning_runs_by_hand_only_where_its_examples_or_its_failures_call_for_it() -> None:
    if not slim.has_torch_pruning():
        assert slim.tools_for("llama") == (slim.ORIGINAL, slim.PRUNEREG)
        return
    assert slim.tools_for("resnet50") == (slim.ORIGINAL, slim.PRUNEREG, slim.TP)
    assert slim.tools_for("vit") == (slim.ORIGINAL, slim.PRUNEREG, slim.TP, slim.TP_HAND)
    assert slim.tools_for("llama") == slim.TOOLS


class _Attention(nn.Module):
    """Four heads of two channels, the way ViT's attention names its projections."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.head_dim = nn.Linear(4, 8), nn.Linear(4, 8), 2


def _keep(module: _Attention, channels: list[int], head_dim: int) -> None:
    for projection in (module.q_proj, module.k_proj):
        projection.weight = nn.Parameter(projection.weight[channels])
        projection.bias = nn.Parameter(projection.bias[channels])
    module.head_dim = head_dim


@pytest.mark.parametrize(
    ("channels", "head_dim", "whole"),
    [
        ([2, 3, 6, 7], 2, True),  # heads 1 and 3 kept whole
        ([0, 2, 4, 6], 1, True),  # every head narrowed: each still reads one original head
        ([1, 2, 5, 6], 2, False),  # channels 1 and 2 of heads 0 and 1 regrouped into one head
    ],
)
def test_the_head_check_reads_which_channels_each_slimmed_head_holds(
    channels: list[int], head_dim: int, whole: bool
) -> None:
    model = nn.Sequential(_Attention())
    slim.tag_attention_channels(model)
    assert slim.heads_kept_whole(model, [2]) is True
    _keep(model[0], channels, head_dim)
    assert slim.heads_kept_whole(model, [2]) is whole
    assert slim.heads_kept_whole(nn.Sequential(nn.Linear(2, 2)), []) is None  # no attention: no verdict


def test_a_library_that_regroups_heads_is_not_the_one_the_targets_compare_with() -> None:
    results = {
        "vit": {
            slim.ORIGINAL: ORIGINAL,
            slim.PRUNEREG: {**MINE, "heads_whole": True},
            slim.TP: {**THEIRS, "heads_whole": False},
            slim.TP_HAND: {**THEIRS, "heads_whole": True, "latency_1": 0.1},
        }
    }
    text = slim.report(results, {}, "a test machine", quick=False, image=None)
    vit = slim.MODELS["vit"].title
    assert "| **no** |" in _row(text, vit, "Torch-Pruning")
    assert _row(text, vit, "speed-up at batch 1 within 10 % of Torch-Pruning, hand-configured's")
    assert slim.sweep_tools("vit", results) == [slim.PRUNEREG, slim.TP_HAND]


def test_a_run_past_its_budget_skips_what_is_left_and_a_second_run_redoes_only_that(tmp_path: Path) -> None:
    page, raw = tmp_path / "benchmarks.md", tmp_path / "slim.json"
    arguments = ["--models", "cnn", "--budget", "0", "--output", str(page), "--json", str(raw)]
    assert slim.main(arguments) == 0
    cnn = slim.MODELS["cnn"].title
    rows = [line for line in page.read_text().splitlines() if line.startswith(f"| {cnn} |")]
    assert rows and all("skipped: the run's 0 minutes were spent" in row for row in rows[:2])
    stored = json.loads(raw.read_text())
    assert set(stored["results"]["cnn"]) == set(slim.tools_for("cnn"))
    # what an earlier run finished is kept: with no time at all, the second run still reports it
    stored["results"]["cnn"] = {
        tool: dict(MINE if tool != slim.ORIGINAL else ORIGINAL) for tool in slim.tools_for("cnn")
    }
    raw.write_text(json.dumps(stored))
    assert slim.main(arguments) == 0
    text = page.read_text()
    assert (
        "skipped" not in text and f"{len(slim.tools_for('cnn'))} results kept from an earlier run in slim.json" in text
    )
    assert _row(text, cnn, "prunereg").startswith(f"| {cnn} | prunereg | 300 (30%) |")


def test_only_reruns_the_models_it_names_and_keeps_the_others_from_the_json_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page, raw = tmp_path / "benchmarks.md", tmp_path / "slim.json"
    old = {tool: dict(THEIRS if tool != slim.ORIGINAL else ORIGINAL) for tool in slim.tools_for("cnn")}
    raw.write_text(json.dumps({"results": {"cnn": old, "resnet50": old}, "sweeps": {}}))
    ran: list[tuple[str, str, bool]] = []

    def fake_run(name: str, tool: str, quick: bool, sweep: bool = False, timeout: float = 0) -> dict[str, Any]:
        ran.append((name, tool, sweep))
        if sweep:
            return {"sweep": [{"ratio": 0.3, "seconds": 1.0, "params": 300, "latency": 0.05}]}
        return dict(MINE if tool != slim.ORIGINAL else ORIGINAL)

    monkeypatch.setattr(slim, "run_in_subprocess", fake_run)
    assert slim.main(["--only", "resnet50", "--output", str(page), "--json", str(raw)]) == 0
    assert {name for name, _, _ in ran} == {"resnet50"}  # resnet50 rerun although the file had it; cnn not
    assert {tool for _, tool, sweep in ran if not sweep} == set(slim.tools_for("resnet50"))
    stored = json.loads(raw.read_text())
    assert stored["results"]["cnn"] == old and stored["results"]["resnet50"][slim.PRUNEREG] == MINE
    assert "resnet50" in stored["sweeps"]
    text = page.read_text()
    cnn, resnet = slim.MODELS["cnn"].title, slim.MODELS["resnet50"].title
    assert _row(text, cnn, "prunereg").startswith(f"| {cnn} | prunereg | 400 (40%) |")  # kept from the file
    assert _row(text, resnet, "prunereg").startswith(f"| {resnet} | prunereg | 300 (30%) |")  # rerun


def test_a_slimming_call_that_hangs_is_stopped_and_reported() -> None:
    with pytest.raises(slim.SlimTimeout, match="did not finish in 1 s"), slim.deadline(1):
        while True:
            pass


def test_the_main_benchmark_runner_keeps_the_slimming_section() -> None:
    page = "# Benchmarks\n\n## Targets\n\nold\n\n" + f"{slim.HEADING}\n\n<!-- slim -->\n| a table |\n<!-- /slim -->\n"
    kept = run.sections_written_elsewhere(page)
    assert len(kept) == 1 and kept[0].startswith(f"\n{slim.HEADING}")


@pytest.mark.slow
def test_a_quick_run_writes_its_section_and_plot_and_leaves_the_rest_of_the_page(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    page = tmp_path / "benchmarks.md"
    others = "# Benchmarks\n\n## Targets\n\nwritten by run.py\n"
    page.write_text(f"{others}\n{slim.HEADING}\n\n<!-- slim -->\nstale\n<!-- /slim -->\n")
    command = [sys.executable, str(ROOT / "benchmarks" / "slim.py"), "--quick", "--models", "resnet50", "vit"]
    subprocess.run(
        [*command, "--output", str(page)],
        check=True,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    text = page.read_text()
    assert text.startswith(others) and "stale" not in text and text.count("<!-- slim -->") == 1
    resnet, vit = slim.MODELS["resnet50"].title, slim.MODELS["vit"].title
    for title in (resnet, vit):
        original, mine = _row(text, title, "original"), _row(text, title, "prunereg")
        assert "failed" not in mine and "| none |" in mine  # slimmed without hand configuration
        assert int(mine.split("|")[3].split("(")[1].rstrip("%) ")) < 100  # parameters left, in per cent
        assert "failed" not in original
    if HAS_TORCH_PRUNING:
        assert _row(text, resnet, "Torch-Pruning") and _row(text, vit, "Torch-Pruning, hand-configured")
    sweep = [line for line in text.splitlines() if line.startswith(f"| {resnet} | prunereg | 0.")]
    ratios = [line.split("|")[3].strip() for line in sweep]
    assert ratios == ["0.3", "0.6"]
    assert f"](images/{slim.IMAGE})" in text
    assert "latency, batch 1 (ms)" in (tmp_path / "images" / slim.IMAGE).read_text()


@pytest.mark.filterwarnings("ignore:Unwrapped parameters detected:UserWarning")  # cls token, positions: right
@pytest.mark.parametrize(("tool", "whole"), [(slim.TP, False), (slim.TP_HAND, True)])
def test_torch_pruning_keeps_vit_heads_whole_only_when_configured_by_hand(tool: str, whole: bool) -> None:
    pytest.importorskip("torch_pruning", reason="the bench extra")
    pytest.importorskip("transformers")
    from tests.support.slim_models import hf_vit, output_shapes

    model, inputs = hf_vit(0)
    slim.tag_attention_channels(model)
    head_dims = [slim._head_dim(module) for module, _ in slim._attention_projections(model)]
    shapes = output_shapes(model, inputs)
    slim.SLIMMERS[tool](model, inputs, 0.5, slim.MODELS["vit"])
    assert output_shapes(model, inputs) == shapes
    assert slim.heads_kept_whole(model, head_dims) is whole


@pytest.mark.slow  # a few seconds of slimming with the profile on
def test_the_phase_profile_times_each_step_and_puts_slimming_back(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/slim_phases.py on the 3-layer MLP, LeNet and a Linear viewed as channels (a second capture)."""
    import slim_phases

    from prunereg._slim import attempt, engine

    def steps() -> list[object]:
        return [getattr({"attempt": attempt, "engine": engine}[where], name) for where, name, _ in slim_phases.PHASES]

    before = steps()
    assert slim_phases.main(["--quick", "--models", "mlp", "lenet", "unflatten", "--rounds", "1"]) == 0
    assert steps() == before
    lines = [line.strip("|").split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    header, *rows = [[cell.strip() for cell in cells] for cells in lines]
    seconds = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    assert float(seconds["unflatten"]["capture (plan)"]) > 0  # its view's channel count is read from a layer:
    assert float(seconds["unflatten"]["capture (check)"]) > 0  # the slimmed model is captured again
    for name in ("mlp", "lenet"):  # no view; LeNet's view(batch, -1) is sized by its input: no second capture
        assert float(seconds[name]["capture (check)"]) == 0


def test_a_run_whose_original_model_did_not_run_leaves_the_page_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n")

    def fake_run(name: str, tool: str, quick: bool, sweep: bool = False, timeout: float = 0) -> dict[str, Any]:
        return {"error": "ImportError: cannot import name 'LlamaForCausalLM'"} if tool == slim.ORIGINAL else dict(MINE)

    monkeypatch.setattr(slim, "run_in_subprocess", fake_run)
    assert slim.main(["--models", "cnn", "--output", str(page)]) == 1
    assert page.read_text() == "# Benchmarks\n"  # the environment failed, not a library: nothing to report
    assert "not written: the original model did not run: cnn: ImportError" in capsys.readouterr().err


def test_forwards_in_turn_go_through_every_order_so_no_model_always_follows_the_same_one() -> None:
    ran: list[str] = []

    def model(name: str) -> Any:
        return lambda *inputs: ran.append(name)

    medians = slim.latencies_in_turn([model("a"), model("b"), model("c")], (), slim.MODELS["cnn"], 6)
    assert len(medians) == 3 and all(seconds >= 0 for seconds in medians)
    rounds = ["".join(ran[3 + 3 * k : 6 + 3 * k]) for k in range(6)]  # after one warm-up forward each
    assert ran[:3] == ["a", "b", "c"] and sorted(rounds) == ["abc", "acb", "bac", "bca", "cab", "cba"]


def test_past_four_models_each_round_is_a_shuffled_order_of_all_of_them() -> None:
    ran: list[str] = []

    def model(name: str) -> Any:
        return lambda *inputs: ran.append(name)

    names = "abcde"
    slim.latencies_in_turn([model(name) for name in names], (), slim.MODELS["cnn"], 8)
    rounds = ["".join(ran[5 + 5 * k : 10 + 5 * k]) for k in range(8)]
    assert all(sorted(order) == list(names) for order in rounds)
    assert len(set(rounds)) > 1 and len({order[0] for order in rounds}) > 1  # not the same order every round


def test_every_latency_comes_from_one_process_per_model_timing_all_libraries_in_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "benchmarks.md"
    untimed = {key: value for key, value in MINE.items() if not key.startswith("latency")}
    tools = slim.tools_for("resnet50")
    timed_calls: list[tuple[str, list[str], list[str]]] = []

    def fake_run(name: str, tool: str, quick: bool, sweep: bool = False, timeout: float = 0) -> dict[str, Any]:
        if sweep:
            return {
                "sweep": [{"ratio": 0.3, "seconds": 1.0, "params": 700}, {"ratio": 0.5, "seconds": 1.0, "params": 300}]
            }
        return {"params": 1000, "macs": 4000} if tool == slim.ORIGINAL else dict(untimed)

    def fake_latency(name: str, tools: list[str], swept: list[str], quick: bool, timeout: float) -> dict[str, Any]:
        timed_calls.append((name, tools, swept))
        in_turn = {"original_latency_1": 0.3, "latency_1": 0.1, "original_latency_32": 6.0, "latency_32": 2.0}
        return {
            "results": {
                slim.ORIGINAL: {"latency_1": 0.3, "latency_32": 6.0},
                **{tool: dict(in_turn) for tool in tools},
            },
            "sweeps": {
                tool: [
                    {"ratio": 0.3, "latency": 0.2, "original_latency": 0.4},
                    {"ratio": 0.5, "latency": 0.1, "original_latency": 0.4},
                ]
                for tool in swept
            },
        }

    monkeypatch.setattr(slim, "run_in_subprocess", fake_run)
    monkeypatch.setattr(slim, "latency_in_subprocess", fake_latency)
    assert slim.main(["--models", "resnet50", "--output", str(page)]) == 0
    assert timed_calls == [
        (
            "resnet50",
            [tool for tool in tools if tool != slim.ORIGINAL],
            slim.sweep_tools("resnet50", {"resnet50": {tool: untimed for tool in tools}}),
        )
    ]
    text = page.read_text()
    resnet = slim.MODELS["resnet50"].title
    assert "| 300.0 ms | - |" in _row(text, resnet, "original")
    # the speed-up against the original timed in the same rounds: 0.3 / 0.1 and 6.0 / 2.0
    assert "| 100.0 ms | x3.00 | 2.00 s | x3.00 |" in _row(text, resnet, "prunereg")
    assert _row(text, resnet, "prunereg", "0.3").endswith("| 200.0 ms | x2.00 |")  # the sweep's original: 0.4 s
