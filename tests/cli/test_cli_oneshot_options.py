"""``prunereg oneshot``'s settings come from one options object; one value parser, one error style, every command."""

from __future__ import annotations

import inspect
import json
import math
import sys
from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner, Result

import prunereg
from prunereg._cli import main
from prunereg._cli.values import parse_value
from prunereg._oneshot import allocation
from prunereg._oneshot import settings as options
from prunereg._oneshot.settings import OneShotOptions
from prunereg._runtime.options import Options, cli_flag
from prunereg._shrink.options import ShrinkOptions

pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from tests.support.tiny_lm import random_text, save_tiny_llama_folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    save_tiny_llama_folder(tmp_path / "dense")
    (tmp_path / "calibration.txt").write_text(random_text(200, seed=1))
    (tmp_path / "eval.txt").write_text(random_text(100, seed=2))
    return tmp_path


def _invoke(folder: Path, *extra: str, method: str = "wanda") -> Result:
    args = [
        "oneshot", str(folder / "dense"), str(folder / "pruned"), "--method", method,
        "--calibration", str(folder / "calibration.txt"), "--samples", "4", "--seq-len", "32", *extra,
    ]  # fmt: skip
    return CliRunner().invoke(main, args)


def _one_error_line(result: Result, status: int = 1) -> str:
    """The error, which must be the last line on stderr, with no traceback anywhere."""
    assert result.exit_code == status, result.output
    assert "Traceback" not in result.output
    assert result.stderr.splitlines()[-1].startswith("Error: "), result.stderr
    return result.stderr.splitlines()[-1]


# -- issue 23 item 3: one options object ------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "options_class", "flags", "some"),
    [
        ("oneshot", OneShotOptions, 10, {"layers", "ignore", "blocks"}),
        ("shrink", ShrinkOptions, 10, {"mlp", "heads", "layers", "experts", "recover", "steps", "blocks"}),
    ],
)
def test_the_commands_flags_help_and_defaults_are_read_from_the_options_object(
    command: str, options_class: type[Options], flags: int, some: set[str]
) -> None:
    params = {param.name: param for param in main.commands[command].params}
    flagged = 0
    for name, (default, setting) in options_class.settings().items():
        flag = cli_flag(name, setting)
        if flag is None:
            assert name not in params
            continue
        flagged += 1
        param = params[name]
        assert isinstance(param, click.Option) and param.opts == [flag]
        assert param.help is not None and param.help.startswith(setting.help)
        assert param.default == (None if setting.repeatable else default)
    assert flagged == flags and some <= set(params)


def test_owls_defaults_are_defined_once() -> None:
    assert (OneShotOptions().owl_threshold, OneShotOptions().owl_lambda) == (options.OWL_THRESHOLD, options.OWL_LAMBDA)
    assert allocation.OWL_THRESHOLD is options.OWL_THRESHOLD and allocation.OWL_LAMBDA is options.OWL_LAMBDA
    source = Path(inspect.getfile(prunereg.oneshot)).parent
    for module in ("engine.py", "folder.py", "allocation.py"):
        assert "0.08" not in (source / module).read_text()
    assert "0.08" not in Path(inspect.getfile(main.commands["oneshot"].callback)).read_text()  # type: ignore[arg-type]


def test_the_python_signatures_show_every_setting_with_its_default() -> None:
    defaults = {name: default for name, (default, _) in OneShotOptions.settings().items()}
    in_memory = inspect.signature(prunereg.oneshot).parameters
    assert {name: in_memory[name].default for name in defaults} == defaults
    assert in_memory["method_options"].kind is inspect.Parameter.VAR_KEYWORD
    folder = inspect.signature(prunereg.oneshot_folder).parameters
    assert "permanent" not in folder and "restore_on_error" not in folder
    assert folder["owl_lambda"].default == options.OWL_LAMBDA and folder["replace"].default is False


def test_oneshot_folder_refuses_the_settings_it_cannot_honour(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="'permanent' is not taken here: oneshot_folder writes plain pruned weights"):
        prunereg.oneshot_folder(tmp_path, tmp_path / "out", "wanda", calibration=torch.ones(1, 4), permanent=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"allocation": "owl", "pattern": "2:4"}, "which an N:M pattern fixes"),
        ({"batch_size": 0}, "batch_size must be a positive int"),
        ({"owl_lambda": "0.1"}, "owl_lambda must be a number"),
        ({"owl_lambda": 0.6}, r"owl_lambda must be in \[0, 0.5\), got 0.6"),
        ({"owl_lambda": -0.1}, r"owl_lambda must be in \[0, 0.5\)"),
        ({"owl_threshold": 0}, "owl_threshold must be > 0, got 0"),
        ({"ignore": [1]}, "ignore must be glob patterns"),
        ({"sparsity": 1.0}, r"sparsity must be in \[0, 1\)"),
    ],
)
def test_the_options_object_checks_every_setting(settings: dict[str, object], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        OneShotOptions(**settings)  # type: ignore[arg-type]


# -- issue 22 item 7: --layers, --ignore, --blocks, --device; -o says what the method takes -------


def test_ignore_and_layers_choose_the_layers_as_in_python(folder: Path) -> None:
    result = _invoke(folder, "--ignore", "*.mlp.*", "--ignore", "*.v_proj", "--json")
    assert result.exit_code == 0, result.output
    names = [layer["name"] for layer in json.loads(result.stdout)["layers"]]
    assert len(names) == 6 and not any(".mlp." in name or "v_proj" in name for name in names)
    pruned = AutoModelForCausalLM.from_pretrained(folder / "pruned")
    assert (pruned.get_parameter("model.layers.0.mlp.up_proj.weight") != 0).all()
    result = _invoke(folder, "--layers", "model.layers.1.*", "--ignore", "*.q_proj", "--json", "--force")
    assert result.exit_code == 0, result.output
    names = [layer["name"] for layer in json.loads(result.stdout)["layers"]]
    assert len(names) == 6 and all(name.startswith("model.layers.1.") for name in names)


def test_an_ignore_glob_matching_nothing_is_refused(folder: Path) -> None:
    assert "ignore ['*.nothing'] match no module of the model" in _one_error_line(
        _invoke(folder, "--ignore", "*.nothing")
    )


def test_blocks_errors_name_the_flag_not_the_python_keyword(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _one_error_line(_invoke(folder, "--blocks", "model.nothing")) == (
        "Error: --blocks model.nothing does not name a non-empty nn.ModuleList of LlamaForCausalLM"
    )
    assert _invoke(folder, "--blocks", "model.layers").exit_code == 0
    from prunereg._runtime import blocks

    monkeypatch.setitem(blocks.BLOCK_PATHS, "llama", "model.elsewhere")  # an architecture prunereg does not know
    line = _one_error_line(_invoke(folder, "--force"))
    assert "name them with --blocks path.to.ModuleList" in line and "blocks=" not in line


def test_device_places_the_model_and_an_unknown_one_is_refused_before_loading(folder: Path) -> None:
    line = _one_error_line(_invoke(folder, "--device", "nowhere:7"), status=2)
    assert "--device" in line and "nowhere:7" in line
    assert not (folder / "pruned").exists()
    assert _invoke(folder, "--device", "cpu", "--stream").exit_code == 0
    assert _invoke(folder, "--device", "cpu", "--force").exit_code == 0


def test_a_method_option_the_method_does_not_take_says_what_it_takes(folder: Path) -> None:
    line = _one_error_line(_invoke(folder, "-o", "nonsense=1"))
    assert line.startswith("Error: method 'wanda' does not take argument 'nonsense' (it takes: ")
    assert "sparsity" not in line  # oneshot's own settings are not the method's to take
    assert not (folder / "pruned").exists()
    with pytest.raises(
        TypeError, match=r"method 'sparsegpt' does not take argument 'nonsense' \(it takes: .*blocksize"
    ):
        prunereg.oneshot(torch.nn.Linear(2, 2), "sparsegpt", calibration=torch.ones(1, 2, dtype=torch.long), nonsense=1)


# -- one parser for --arg, --amount and -o -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("2", 2), ("0.5", 0.5), ("1e-3", 1e-3), ("inf", math.inf), ("True", True), ("None", None), ("(0, 1)", (0, 1)),
     ("fro", "fro"), ("2:4", "2:4"), ("'64'", "64"), ("", "")],
)  # fmt: skip
def test_one_parser_reads_every_command_line_value(text: str, value: object) -> None:
    assert parse_value(text) == value and type(parse_value(text)) is type(value)


@pytest.mark.parametrize("text", ["1_0", "0.000_1", "-1_000"])
def test_a_number_with_underscores_is_refused_not_read_as_another(text: str) -> None:
    with pytest.raises(ValueError, match="write it without '_'"):
        parse_value(text)


def test_prune_and_oneshot_refuse_underscored_numbers_alike(folder: Path, tmp_path: Path) -> None:
    for flag in (["-o", "blocksize=1_0"], ["--owl-threshold", "1_0"], ["--samples", "1_0"]):
        oneshot = _one_error_line(_invoke(folder, *flag, method="sparsegpt"), status=2)
        assert "'1_0' is not a number here: write it without '_'" in oneshot
    save_file({"w": torch.randn(4, 4)}, tmp_path / "in.safetensors")
    prune = ["prune", str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors"), "--method"]
    for extra in (
        ["l1_unstructured", "--amount", "1_0"],
        ["ln_structured", "--arg", "n=1_0", "--amount", "1"],
        ["random_unstructured", "--amount", "0.5", "--seed", "1_0"],
    ):
        line = _one_error_line(CliRunner().invoke(main, [*prune, *extra]), status=2)
        assert "'1_0' is not a number here: write it without '_'" in line
    assert not (tmp_path / "out.safetensors").exists()


# -- --debug on every command, declared once ---------------------------------------------------


def test_every_command_has_debug_from_the_one_command_class() -> None:
    for name, command in main.commands.items():
        debug = [param for param in command.params if param.name == "debug"]
        assert len(debug) == 1, name
    source = Path(inspect.getfile(main.commands["oneshot"].callback)).parent  # type: ignore[arg-type]
    assert sum(text.count('"--debug"') for text in (path.read_text() for path in source.glob("*.py"))) == 1


def test_debug_shows_the_traceback_instead_of_the_line(folder: Path) -> None:
    quiet = _invoke(folder, "--blocks", "model.nothing")
    assert quiet.exit_code == 1 and quiet.exception is not None and isinstance(quiet.exception, SystemExit)
    loud = _invoke(folder, "--blocks", "model.nothing", "--debug")
    assert isinstance(loud.exception, ValueError) and "blocks='model.nothing'" in str(loud.exception)
    assert CliRunner().invoke(main, ["info", "no_such_method", "--debug"]).exit_code == 1


# -- issue 20 item 14: every failure is one line ----------------------------------------------


def _break_weights(model: Path) -> None:
    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:100])


def _pickle_only(model: Path) -> None:
    torch.save(load_file(model / "model.safetensors"), model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()


def _no_tokenizer(model: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (model / name).unlink(missing_ok=True)


def _bad_config(model: Path) -> None:
    (model / "config.json").write_text("{not json")


def _nan_weights(model: Path) -> None:
    weights = load_file(model / "model.safetensors")
    weights["model.layers.0.self_attn.q_proj.weight"][0, 0] = math.nan
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})


def _non_utf8_text(model: Path) -> None:
    (model.parent / "calibration.txt").write_bytes(b"w1 w2 \xff\xfe w3 " * 100)


@pytest.mark.parametrize(
    ("damage", "method"),
    [
        (_break_weights, "wanda"),
        (_pickle_only, "wanda"),
        (_no_tokenizer, "wanda"),
        (_bad_config, "wanda"),
        (_nan_weights, "sparsegpt"),
        (_non_utf8_text, "wanda"),
    ],
)
def test_a_damaged_model_folder_or_text_ends_in_one_line(folder: Path, damage, method: str) -> None:  # type: ignore[no-untyped-def]
    damage(folder / "dense")
    failed = 0
    for stream in (False, True):
        result = _invoke(folder, *["--stream"] * stream, "--force", method=method)
        if result.exit_code == 0:  # transformers reads a pickle in memory (weights only); --stream needs safetensors
            assert damage is _pickle_only and not stream
            assert AutoModelForCausalLM.from_pretrained(folder / "pruned") is not None
            continue
        _one_error_line(result)
        failed += 1
    assert failed >= 1 and (failed == 2 or (folder / "pruned").is_dir())


@pytest.mark.parametrize(
    "failure",
    [
        MemoryError(),
        OSError(28, "No space left on device"),
        RuntimeError("linalg.cholesky: The factorization could not"),
    ],
)
def test_any_failure_while_pruning_is_one_line(
    folder: Path, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    wanda = prunereg.get("wanda")

    def fail(self, weights, statistics, sparsities):  # type: ignore[no-untyped-def]
        raise failure

    monkeypatch.setattr(wanda, "prune_group", fail)
    line = _one_error_line(_invoke(folder))
    assert type(failure).__name__ in line or "No space left" in line
    assert not (folder / "pruned").exists()


def test_a_method_that_exits_is_one_line_and_plugin_code_error_is_public(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class ExitsInGroup(prunereg.CalibratedMethod):  # a method's own code is guarded when its class is made
        def prune_group(self, weights, statistics, sparsities):  # type: ignore[no-untyped-def]
            sys.exit(0)

    monkeypatch.setattr(prunereg.get("wanda"), "prune_group", ExitsInGroup.prune_group)
    line = _one_error_line(_invoke(folder))
    assert line.startswith("Error: PluginCodeError: ") and "ExitsInGroup.prune_group called sys.exit(0)" in line
    assert issubclass(prunereg.PluginCodeError, RuntimeError) and "PluginCodeError" in prunereg.__all__


@pytest.mark.parametrize(("after", "shown"), [(math.nan, "NaN after"), (math.inf, "infinite after")])
def test_a_perplexity_that_is_no_number_is_null_in_json_and_explained_in_text(
    folder: Path, monkeypatch: pytest.MonkeyPatch, after: float, shown: str
) -> None:
    values = iter([12.5, after, 12.5, after])
    monkeypatch.setattr(prunereg, "perplexity", lambda *args, **kwargs: next(values))
    result = _invoke(folder, "--eval", str(folder / "eval.txt"), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert (report["perplexity_before"], report["perplexity_after"]) == (12.5, None)
    text = _invoke(folder, "--eval", str(folder / "eval.txt"), "--force")
    assert text.exit_code == 0, text.output
    assert f"12.50 before, {shown}" in text.stdout and "note: " in text.stderr


def test_perplexity_beyond_what_a_float_holds_is_infinite_not_an_overflow_error() -> None:
    class Certain(torch.nn.Module):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:  # always sure of token 0, which never comes
            logits = torch.zeros(*ids.shape, 8)
            logits[..., 0] = 1e4
            return logits

    ids = torch.full((16,), 3)
    assert prunereg.perplexity(Certain(), ids, window=8) == math.inf
