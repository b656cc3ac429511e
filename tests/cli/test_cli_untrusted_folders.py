"""``prunereg slim``, ``shrink`` and ``oneshot`` on hostile model folders: refused in one line, nothing left behind.

A FIFO wherever a command can be led to open a file (the weights, an index's
shards, the file ``transformers_weights`` names, the config, every tokenizer
file), a config that asks for more than its weights hold, a folder without a
tokenizer. Every case runs with a FIFO unblocker (:mod:`tests.support.fifos`),
so code that would wait on a FIFO fails the test instead of hanging the suite;
the real-process cases have a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file

import prunereg
from prunereg._cli import main
from tests.support.fifos import fifo_unblocker
from tests.support.model_folders import (
    BEYOND_THE_WEIGHTS,
    FIX,
    UNLIKE_THE_WEIGHTS,
    edit_config,
    saved_tiny_llama,
)
from tests.support.processes import DEFAULT_TERMINATION
from tests.support.tiny_lm import random_text

TIMEOUT = 120
COMMANDS = {
    "slim": ["slim", "--ratio", "0.5"],
    "shrink": ["shrink", "-m", "magnitude_sp", "--mlp", "0.5"],
    "shrink --stream": ["shrink", "-m", "magnitude_sp", "--mlp", "0.5", "--stream"],
    "oneshot": ["oneshot", "-m", "magnitude", "--calibration", "{calibration}", "--samples", "2", "--seq-len", "8"],
    "oneshot --stream": [
        "oneshot", "-m", "magnitude", "--calibration", "{calibration}", "--samples", "2", "--seq-len", "8", "--stream",
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_tiny_llama(tmp_path_factory)


@pytest.fixture
def folder(template: Path, tmp_path: Path) -> Path:
    """``tmp_path`` holding the tiny model (``model``) and a calibration text, and nothing else."""
    shutil.copytree(template, tmp_path / "model")
    (tmp_path / "calibration.txt").write_text(random_text(100, seed=1))
    return tmp_path


def _args(folder: Path, command: str) -> list[str]:
    name, *options = COMMANDS[command]
    options = [option.format(calibration=folder / "calibration.txt") for option in options]
    return [name, str(folder / "model"), str(folder / "out"), *options]


def _invoke(folder: Path, command: str) -> Result:
    return CliRunner().invoke(main, _args(folder, command))


def _left_alone(folder: Path) -> None:
    """No output folder, no temporary folder beside it."""
    assert sorted(os.listdir(folder)) == ["calibration.txt", "model"]


def _sharded(model: Path) -> None:
    """The weights as two shards and an index, as transformers saves a large model."""
    tensors = load_file(model / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:10], "model-00002-of-00002.safetensors": names[10:]}
    for shard, keys in shards.items():
        save_file({key: tensors[key] for key in keys}, model / shard, metadata={"format": "pt"})
    weight_map = {key: shard for shard, keys in shards.items() for key in keys}
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (model / "model.safetensors").unlink()


def _named_weights(model: Path) -> None:
    """The weights under the name config.json's ``transformers_weights`` gives."""
    (model / "model.safetensors").rename(model / "weights.safetensors")
    edit_config(model, transformers_weights="weights.safetensors")


# Each place a command can be led to open: how the folder leads there, and the file that becomes a FIFO.
LEADS = {
    "model.safetensors": (None, "model.safetensors"),
    "a shard the index names": (_sharded, "model-00002-of-00002.safetensors"),
    "the index": (_sharded, "model.safetensors.index.json"),
    "the weights transformers_weights names": (_named_weights, "weights.safetensors"),
    "config.json": (None, "config.json"),
    "generation_config.json": (None, "generation_config.json"),
    "tokenizer.json": (None, "tokenizer.json"),
    "tokenizer_config.json": (None, "tokenizer_config.json"),
    "special_tokens_map.json": (None, "special_tokens_map.json"),
    "tokenizer.model": (None, "tokenizer.model"),
    "chat_template.jinja": (None, "chat_template.jinja"),
    "a chat template of additional_chat_templates": (None, "additional_chat_templates/tool_use.jinja"),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("lead", LEADS)
def test_a_fifo_wherever_a_command_can_be_led_is_refused_in_one_line(folder: Path, lead: str, command: str) -> None:
    prepare, name = LEADS[lead]
    model = folder / "model"
    if prepare is not None:
        prepare(model)
    fifo = model / name
    fifo.unlink(missing_ok=True)
    fifo.parent.mkdir(exist_ok=True)
    os.mkfifo(fifo)
    with fifo_unblocker(fifo):
        result = _invoke(folder, command)
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"Error: '{fifo}' is a FIFO (named pipe), not a regular file; replace it with the model's own {name}\n"
    )
    _left_alone(folder)


def test_a_fifo_the_folder_holds_under_another_name_is_refused_too(folder: Path) -> None:
    fifo = folder / "model" / "README.md"
    os.mkfifo(fifo)
    with fifo_unblocker(fifo):
        result = _invoke(folder, "oneshot --stream")
    assert result.stderr == (
        f"Error: '{fifo}' is a FIFO (named pipe), not a regular file; a model folder holds files and folders only: "
        "remove it\n"
    )
    _left_alone(folder)


def test_python_folder_functions_refuse_a_fifo_too(folder: Path) -> None:
    fifo = folder / "model" / "config.json"
    fifo.unlink()
    os.mkfifo(fifo)
    refusal = f"'{fifo}' is a FIFO (named pipe), not a regular file; replace it with the model's own config.json"
    with fifo_unblocker(fifo):
        with pytest.raises(prunereg.CheckpointError) as refused:
            prunereg.oneshot_folder(folder / "model", folder / "out", "magnitude", calibration="w1 w2 w3 w4")
        assert str(refused.value) == refusal
        with pytest.raises(prunereg.CheckpointError) as refused:
            prunereg.shrink_folder(folder / "model", folder / "out", "magnitude_sp", mlp=0.5)
        assert str(refused.value) == refusal
    _left_alone(folder)


@pytest.mark.parametrize("name", ["model.safetensors", "prunereg_masks.safetensors", "generation_config.json"])
def test_prunereg_from_pretrained_checks_the_folder_as_the_commands_do(folder: Path, name: str) -> None:
    """It checked links only: a FIFO of weights was "no weights", one of masks was passed over (masks lost)."""
    from transformers import AutoModelForCausalLM

    fifo = folder / "model" / name
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    with fifo_unblocker(fifo), pytest.raises(prunereg.CheckpointError) as refused:
        prunereg.from_pretrained(AutoModelForCausalLM, folder / "model")
    assert str(refused.value) == (
        f"'{fifo}' is a FIFO (named pipe), not a regular file; replace it with the model's own {name}"
    )


def test_prunereg_from_pretrained_refuses_a_file_larger_than_its_kind_unread(folder: Path) -> None:
    """transformers read any generation_config.json whole, however large."""
    from transformers import AutoModelForCausalLM

    with open(folder / "model" / "generation_config.json", "r+b") as file:
        file.truncate(16_000_001)  # sparse: nothing is written
    with pytest.raises(prunereg.CheckpointError, match=r"generation_config.json' holds 16.0 MB, more than a config"):
        prunereg.from_pretrained(AutoModelForCausalLM, folder / "model")


@pytest.mark.parametrize("command", ["oneshot", "oneshot --stream", "shrink"])
def test_a_tokenizer_file_the_tokenizer_config_names_out_of_the_folder_is_refused(folder: Path, command: str) -> None:
    """``fast_tokenizer_files`` led transformers to read a tokenizer file outside MODEL_DIR, and the run went on."""
    (folder / "elsewhere").mkdir()
    shutil.copy(folder / "model" / "tokenizer.json", folder / "elsewhere" / "tokenizer.1.0.json")
    config = json.loads((folder / "model" / "tokenizer_config.json").read_text())
    config["fast_tokenizer_files"] = ["../elsewhere/tokenizer.1.0.json"]
    (folder / "model" / "tokenizer_config.json").write_text(json.dumps(config))
    result = _invoke(folder, command)
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"Error: MODEL_DIR '{folder / 'model'}' names '../elsewhere/tokenizer.1.0.json', which leads out of it; "
        "prunereg reads nothing outside the model folder\n"
    )
    assert sorted(os.listdir(folder)) == ["calibration.txt", "elsewhere", "model"]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["oneshot --stream", "shrink --stream"])
def test_a_streamed_run_never_blocks_on_a_fifo_and_sigterm_leaves_nothing(folder: Path, command: str) -> None:
    """A real process, sent SIGTERM if it ever opens the FIFO, ends by the refusal or the signal and leaves nothing.

    A run that opened the FIFO shows as a reader the test can open the writing end for; it then waits in native code
    for data (SIGTERM's handler runs only once that returns), and before this fix ended leaving its staging folder.
    """
    _sharded(folder / "model")
    fifo = folder / "model" / "model-00002-of-00002.safetensors"  # holds the weights outside the blocks
    fifo.unlink()
    os.mkfifo(fifo)
    run = subprocess.Popen(
        [sys.executable, "-c", DEFAULT_TERMINATION + "from prunereg._cli import main; main()", *_args(folder, command)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    writer = None
    try:
        deadline = time.monotonic() + TIMEOUT
        while run.poll() is None and writer is None and time.monotonic() < deadline:
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # succeeds only while the run has it open
            except OSError:
                time.sleep(0.01)
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=30)
    finally:
        run.kill()
        if writer is not None:
            os.close(writer)
    assert run.returncode in (1, -signal.SIGTERM), "SIGTERM did not end the run: it is blocked on the FIFO"
    if run.returncode == 1:
        assert stderr.splitlines()[-1].startswith(f"Error: '{fifo}' is a FIFO (named pipe)")
    _left_alone(folder)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("changes", "refusal", "before"),
    [(*case, "transformers read the config") for case in BEYOND_THE_WEIGHTS]
    + [(*case, "the weights were loaded") for case in UNLIKE_THE_WEIGHTS],
)
def test_a_config_unlike_its_weights_is_refused_in_one_line_before_any_model_is_built(
    folder: Path, command: str, changes: dict[str, int], refusal: str, before: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    def never(*_: object, **__: object) -> None:
        pytest.fail(f"{before} before the config was checked against the weights")

    monkeypatch.setattr(transformers.LlamaForCausalLM, "from_pretrained", never)
    if before == "transformers read the config":
        monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", never)
    edit_config(folder / "model", **changes)
    result = _invoke(folder, command)
    assert result.exit_code == 1, result.output
    assert result.stderr == f"Error: MODEL_DIR's config.json {refusal}{FIX}\n"  # no LOAD REPORT table before it
    _left_alone(folder)


CAPPED_PRUNEREG = """
import resource, sys
import torch, transformers
from prunereg._cli import main
# What the imports took, and 2 GiB more: building a billion blocks would exceed it.
size = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + 2**31, size + 2**31))
main()
"""


@pytest.mark.slow
def test_a_billion_blocks_are_refused_in_a_real_process_before_memory_grows(folder: Path) -> None:
    """The issue's case as a real process whose address space may grow by 2 GiB beyond its imports."""
    edit_config(folder / "model", num_hidden_layers=10**9)
    run = subprocess.run(
        [sys.executable, "-c", CAPPED_PRUNEREG, *_args(folder, "slim")], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert run.returncode == 1, run.stderr
    assert run.stderr.splitlines()[-1].startswith("Error: MODEL_DIR's config.json gives num_hidden_layers 1000000000")
    _left_alone(folder)


@pytest.mark.parametrize("command", ["oneshot", "oneshot --stream", "shrink"])
def test_a_folder_without_a_tokenizer_says_so(folder: Path, command: str) -> None:
    (folder / "model" / "tokenizer.json").unlink()
    (folder / "model" / "tokenizer_config.json").unlink()
    result = _invoke(folder, command)
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"Error: MODEL_DIR '{folder / 'model'}' holds no tokenizer (no tokenizer.json, tokenizer.model or vocabulary "
        "file); copy the model's tokenizer files into it\n"
    )
    _left_alone(folder)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_tokenizer_file_that_is_not_json_is_named(folder: Path, name: str) -> None:
    (folder / "model" / name).write_text("{ this is not json")
    result = _invoke(folder, "oneshot")
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"Error: MODEL_DIR's {name} is not JSON (Expecting property name enclosed in double quotes: line 1 column 3 "
        f"(char 2)); replace it with the model's own {name}\n"
    )
    _left_alone(folder)


def test_a_sentencepiece_tokenizer_without_the_package_names_what_to_install(folder: Path) -> None:
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("sentencepiece is installed here")
    model = folder / "model"
    (model / "tokenizer.json").unlink()
    (model / "tokenizer.model").write_bytes(os.urandom(64))
    (model / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    result = _invoke(folder, "shrink")
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[-1] == (
        "Error: MODEL_DIR's tokenizer is tokenizer.model without a tokenizer.json, which transformers reads only with "
        "the sentencepiece package (tiktoken for a tiktoken file): pip install sentencepiece, or copy the model's "
        "tokenizer.json into the folder"
    )
    _left_alone(folder)


def test_python_calibration_texts_name_a_missing_tokenizer_too(folder: Path) -> None:
    model = folder / "model"
    (model / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=rf"^model_dir '{model}' holds no tokenizer \(no tokenizer.json"):
        prunereg.oneshot_folder(model, folder / "out", "magnitude", calibration="w1 w2 w3 w4 w5")
    _left_alone(folder)


def test_prunereg_from_pretrained_checks_the_config_against_the_weights_before_building(folder: Path) -> None:
    """transformers built the model the config asked for first: here it tried to allocate 2**40 wide layers."""
    from transformers import AutoModelForCausalLM

    edit_config(folder / "model", hidden_size=2**40)
    with pytest.raises(ValueError) as refused:
        prunereg.from_pretrained(AutoModelForCausalLM, folder / "model")
    assert str(refused.value) == "pretrained's config.json " + BEYOND_THE_WEIGHTS[1][1] + FIX
