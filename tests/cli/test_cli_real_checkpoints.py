"""``prunereg prune`` and ``report`` on checkpoints as users have them: pruned state dicts, views, transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from click.testing import CliRunner, Result
from safetensors.torch import save_file
from torch import nn

from prunereg._cli import main
from prunereg._files import checkpoint
from tests.support.state_dicts import ENCODER_MATRICES, minilm_like
from tests.support.torch_reference import TORCH_CLASSES

SCRIPT = Path(sys.executable).with_name("prunereg")


def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="prunereg")


def run_script(*args: object, **streams: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *map(str, args)], text=True, timeout=120, check=False, **(streams or {"capture_output": True})
    )


def network() -> nn.Sequential:
    """Distinct magnitudes everywhere, so that no method meets a tie."""
    net = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 4))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in net.parameters():
            n = parameter.numel()
            values = (torch.randperm(n, generator=generator) + 1.0) / n
            parameter.copy_(
                (values * (torch.randint(0, 2, (n,), generator=generator) * 2 - 1)).reshape(parameter.shape)
            )
    return net


def torch_pruned() -> nn.Sequential:
    """The first layer pruned by torch.nn.utils.prune, the second not."""
    net = network()
    torch_prune.l1_unstructured(net[0], "weight", amount=0.4)
    return net


def save_state(net: nn.Module, path: Path) -> Path:
    if path.suffix == ".safetensors":
        save_file({key: value.contiguous() for key, value in net.state_dict().items()}, path)
    else:
        torch.save(net.state_dict(), path)
    return path


# Pruned state dicts: <name>_orig and <name>_mask are the tensor <name>.


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_report_shows_the_tensor_the_model_computes(tmp_path: Path, suffix: str) -> None:
    net = torch_pruned()
    path = save_state(net, tmp_path / f"pruned{suffix}")
    result = invoke("report", path, "--json")
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)["tensors"]}
    assert sorted(rows) == ["0.bias", "0.weight", "2.bias", "2.weight"]  # no weight_orig, no weight_mask
    assert rows["0.weight"]["zeros"] == int((net[0].weight == 0).sum()) == 19  # round(0.4 * 48)
    assert rows["0.weight"]["pruned_by"] == ["mask"] and rows["2.weight"]["pruned_by"] == []
    table = invoke("report", path).stdout.splitlines()
    assert table[0].split()[-2:] == ["PRUNED", "BY"]
    assert next(line for line in table if line.startswith("0.weight")).split()[-2:] == ["[####......]", "mask"]


CASES = [
    ("l1_unstructured", {"amount": 0.5}, False),
    ("random_unstructured", {"amount": 7}, False),
    ("ln_structured", {"amount": 2, "n": 1, "dim": 0}, False),
    ("random_structured", {"amount": 0.5, "dim": 1}, False),
    ("l1_unstructured", {"amount": 0.6}, True),
]


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
@pytest.mark.parametrize(("method", "arguments", "together"), CASES)
def test_prune_prunes_again_as_torch_does(
    tmp_path: Path, suffix: str, method: str, arguments: dict, together: bool
) -> None:
    path = save_state(torch_pruned(), tmp_path / f"pruned{suffix}")
    output, masks = tmp_path / f"again{suffix}", tmp_path / "masks.safetensors"
    options = [f"--amount={arguments['amount']}"] + [f"--arg={k}={v}" for k, v in arguments.items() if k != "amount"]
    result = invoke(
        "prune",
        path,
        output,
        "--method",
        method,
        *options,
        "--seed",
        3,
        "--masks",
        masks,
        *(["--global"] if together else []),
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("pruned 2 of 4 tensors ")

    reference = torch_pruned()
    pairs = [(reference[0], "weight"), (reference[2], "weight")]
    torch.manual_seed(3)
    if together:
        torch_prune.global_unstructured(pairs, TORCH_CLASSES[method], **arguments)
    else:
        for module, name in pairs:
            TORCH_CLASSES[method].apply(module, name, **arguments)
    written = checkpoint.read(output).tensors
    expected = dict(reference.state_dict())
    expected["2.weight"] = reference[2].weight.detach()  # pruned for the first time: written plain, as it was read
    del expected["2.weight_orig"], expected["2.weight_mask"]
    assert sorted(written) == sorted(expected)  # the pruned pair stays a pair: weight_orig and weight_mask
    for key, value in expected.items():
        assert written[key].dtype == value.dtype and torch.equal(written[key], value), key
    saved_masks = checkpoint.read(masks).tensors
    assert torch.equal(saved_masks["0.weight"], reference[0].weight_mask.bool())
    assert torch.equal(saved_masks["2.weight"], reference[2].weight_mask.bool())
    restored = torch_pruned()
    restored.load_state_dict(written)  # loads into the model as it was pruned
    assert torch.equal(restored[0].weight_mask, reference[0].weight_mask)


def test_a_mask_of_other_values_is_refused(tmp_path: Path) -> None:
    state = torch_pruned().state_dict()
    state["0.weight_mask"] = state["0.weight_mask"] * 0.5
    path = tmp_path / "odd.pt"
    torch.save(state, path)
    result = invoke("prune", path, tmp_path / "out.pt", "--method", "l1_unstructured", "--amount", 0.5)
    assert result.exit_code == 1
    assert result.stderr == "Error: cannot prune '0.weight' again: its mask holds values other than 0 and 1\n"
    assert os.listdir(tmp_path) == ["odd.pt"]


def test_a_lone_orig_or_mask_is_an_ordinary_tensor(tmp_path: Path) -> None:
    path = tmp_path / "lonely.safetensors"
    save_file(
        {
            "a.weight_orig": torch.ones(2, 2),
            "b.weight_mask": torch.ones(3, 3),
            "c.weight_orig": torch.ones(2, 2),
            "c.weight_mask": torch.ones(2, 3),
        },
        path,
    )  # shapes differ: no pair
    names = [row["name"] for row in json.loads(invoke("report", path, "--json").stdout)["tensors"]]
    assert sorted(names) == ["a.weight_orig", "b.weight_mask", "c.weight_mask", "c.weight_orig"]


# Non-contiguous tensors, as real .pt checkpoints hold them (transposed or sliced views).


def views() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    base = torch.randn(10, 12, generator=generator)
    return {
        "fc.weight": torch.randn(6, 8, generator=generator).t(),
        "conv.weight": torch.randn(4, 3, 3, 2, generator=generator).permute(0, 3, 1, 2),
        "sliced.weight": base[::2, 1:8],
        "fc.bias": torch.randn(8, generator=generator),
    }


@pytest.mark.parametrize(
    ("method", "arguments"),
    [
        ("ln_structured", {"amount": 0.5, "n": 2, "dim": 0}),
        ("random_structured", {"amount": 0.5, "dim": 1}),
        ("l1_unstructured", {"amount": 0.3}),
    ],
)
def test_non_contiguous_tensors_prune_and_save_their_masks(tmp_path: Path, method: str, arguments: dict) -> None:
    path = tmp_path / "views.pt"
    torch.save(views(), path)
    assert not any(tensor.is_contiguous() for name, tensor in torch.load(path).items() if name != "fc.bias")
    output, masks = tmp_path / "out.pt", tmp_path / "masks.safetensors"
    options = [f"--arg={key}={value}" for key, value in arguments.items()]
    result = invoke("prune", path, output, "--method", method, *options, "--seed", 5, "--masks", masks)
    assert result.exit_code == 0, result.output
    torch.manual_seed(5)
    written, saved = checkpoint.read(output).tensors, checkpoint.read(masks).tensors
    for name in ["fc.weight", "conv.weight", "sliced.weight"]:  # torch itself fails on these views: use copies
        module = nn.Module()
        module.weight = nn.Parameter(views()[name].contiguous())
        TORCH_CLASSES[method].apply(module, "weight", **arguments)
        assert torch.equal(written[name], module.weight.detach()), name
        assert torch.equal(saved[name], module.weight_mask.bool()), name


# Transformer checkpoints: embeddings, norms and the head are left alone by default.


def test_a_transformer_is_pruned_where_users_expect(tmp_path: Path) -> None:
    path = tmp_path / "minilm.safetensors"
    tensors = minilm_like()
    save_file(tensors, path)
    output = tmp_path / "out.safetensors"
    result = invoke("prune", path, output, "--method", "l1_unstructured", "--amount", 0.5, "--global")
    assert result.exit_code == 0, result.output
    written = checkpoint.read(output).tensors
    for name, tensor in tensors.items():
        if name in ENCODER_MATRICES:
            assert int((written[name] == 0).sum()) > 0, name
        else:
            assert torch.equal(written[name], tensor), name  # embeddings, norms, pooler, biases untouched
    assert sum(int((written[name] == 0).sum()) for name in ENCODER_MATRICES) == 36 * 16 // 2
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"pruned 36 of {len(tensors)} tensors with l1_unstructured")
    assert "  skipped 3, embedding:" in lines
    assert any(line.startswith("  skipped 2, output head: pooler.dense.") for line in lines)


def test_include_brings_back_what_the_defaults_leave(tmp_path: Path) -> None:
    path = tmp_path / "minilm.safetensors"
    save_file(minilm_like(), path)
    output = tmp_path / "out.safetensors"
    result = invoke(
        "prune",
        path,
        output,
        "--method",
        "l1_unstructured",
        "--amount",
        0.5,
        "--include",
        "pooler.dense.weight",
        "--include",
        "embeddings.word_embeddings.weight",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1] == "  selected 2: embeddings.word_embeddings.weight, pooler.dense.weight"
    written = checkpoint.read(output).tensors
    assert int((written["pooler.dense.weight"] == 0).sum()) == 8
    assert torch.equal(
        written["encoder.layer.0.output.dense.weight"], minilm_like()["encoder.layer.0.output.dense.weight"]
    )


@pytest.mark.slow
def test_dry_run_prints_the_selection_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "minilm.pt"
    torch.save(minilm_like(layers=12), path)
    (tmp_path / "out.pt").write_bytes(b"kept")  # no --force needed: nothing is written
    done = run_script(
        "prune",
        path,
        tmp_path / "out.pt",
        "--method",
        "l1_unstructured",
        "--amount",
        "0.5",
        "--masks",
        tmp_path / "masks.safetensors",
        "--dry-run",
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0] == "would prune 72 of 200 tensors with l1_unstructured (dry run: nothing written)"
    assert "    encoder.layer.*.intermediate.dense.weight (12)" in lines
    assert len(lines) < 40
    assert sorted(os.listdir(tmp_path)) == ["minilm.pt", "out.pt"] and (tmp_path / "out.pt").read_bytes() == b"kept"


def test_dry_run_still_checks_the_method(tmp_path: Path) -> None:
    path = tmp_path / "minilm.pt"
    torch.save(minilm_like(layers=1), path)
    result = invoke("prune", path, tmp_path / "out.pt", "--method", "ln_structured", "--amount", 0.5, "--dry-run")
    assert result.exit_code == 1 and result.stderr == "Error: method 'ln_structured' needs argument 'n'\n"


# Progress: on a terminal only, never on a pipe or with --json.


def on_a_terminal(*args: object) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the command with stderr on a pseudo-terminal; return it and what the terminal showed."""
    pty = pytest.importorskip("pty")
    controller, terminal = pty.openpty()
    try:
        done = run_script(*args, stderr=terminal, stdout=subprocess.PIPE)
    finally:
        os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal's other end is closed: everything has been read
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    return done, shown.decode()


@pytest.mark.slow
def test_report_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    path = tmp_path / "minilm.safetensors"
    save_file(minilm_like(layers=2), path)
    done, shown = on_a_terminal("report", path)
    assert done.returncode == 0 and "counting zeros in minilm.safetensors" in shown
    assert "counting zeros" not in done.stdout and done.stdout.startswith("NAME")
    done, shown = on_a_terminal("report", path, "--json")
    assert done.returncode == 0 and shown == ""
    assert json.loads(done.stdout)["total"]["numel"] == sum(t.numel() for t in minilm_like(layers=2).values())
    piped = run_script("report", path)
    assert piped.returncode == 0 and piped.stderr == ""


def test_sparsity_of_a_re_pruned_file_adds_up(tmp_path: Path) -> None:
    path = save_state(torch_pruned(), tmp_path / "pruned.pt")
    output = tmp_path / "again.pt"
    assert invoke("prune", path, output, "--method", "l1_unstructured", "--amount", 0.5).exit_code == 0
    rows = {row["name"]: row for row in json.loads(invoke("report", output, "--json").stdout)["tensors"]}
    assert rows["0.weight"]["zeros"] == 19 + round(0.5 * (48 - 19))  # half of what the first pruning left
    assert rows["2.weight"]["zeros"] == 12
