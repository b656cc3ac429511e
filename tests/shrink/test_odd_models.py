"""prunereg.shrink on odd models: a cut that breaks a block, meta weights, sharing, projections it cannot cut.

Each is one line naming the block and module (or both places shared) in
prunereg's words, and the model, its config and its modules' attributes are
exactly as they were; a folder shrunk block by block writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from torch import nn  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

import prunereg  # noqa: E402
from prunereg._cli import main  # noqa: E402
from tests.shrink.models import build, calibration_ids  # noqa: E402
from tests.support.tiny_lm import random_text, save_tiny_llama_folder, tiny_llama  # noqa: E402

Snapshot = tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, dict[str, Any]]]
_PLAIN = (bool, int, float, str, tuple, type(None))


def _snapshot(model: nn.Module) -> Snapshot:
    """Every tensor (a copy), the config, and each module's plain attributes (sizes, head counts, layer_idx)."""
    tensors = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    attributes = {
        name: {key: value for key, value in vars(module).items() if isinstance(value, _PLAIN) and key[0] != "_"}
        for name, module in model.named_modules()
    }
    return tensors, model.config.to_dict(), attributes


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).contiguous().view(torch.uint8)


def _assert_unchanged(model: nn.Module, before: Snapshot) -> None:
    tensors, config, attributes = before
    after, config_after, attributes_after = _snapshot(model)
    assert after.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert after[name].dtype == tensor.dtype and after[name].shape == tensor.shape, name
        assert torch.equal(_bits(after[name]), _bits(tensor)), name
    assert config_after == config
    assert attributes_after == attributes


def _refused(model: nn.Module, method: str, calibration: Any, options: dict[str, Any], message: str) -> str:
    """Shrink ``model``, expecting one line holding ``message``, the model unchanged; the line."""
    before = _snapshot(model)
    with pytest.raises(ValueError) as caught:
        prunereg.shrink(model, method, calibration, **options)
    text = str(caught.value)
    assert message in text and "\n" not in text, text
    _assert_unchanged(model, before)
    return text


def _reads_old_width(module: nn.Module, width: int) -> None:
    """A forward pre-hook that multiplies ``module``'s input by ``torch.ones(width)``: the width shrinking changes."""
    module.register_forward_pre_hook(lambda _, args: (args[0] * torch.ones(width), *args[1:]))


def _mlp_block(index: int) -> Callable[[nn.Module], None]:
    return lambda model: _reads_old_width(model.model.layers[index].mlp.down_proj, 48)


def _router_of_last_block(model: nn.Module) -> None:
    model.model.layers[-1].mlp.gate.register_forward_hook(lambda _, args, out: (out[0] * torch.ones(4), *out[1:]))


BREAKS_ONCE_CUT = [
    # flap observes the dense model and never ran a block once cut: the model came back broken.
    pytest.param(
        "llama", _mlp_block(1), "flap", {"mlp": 0.5}, "model.layers.1", "model.layers.1.mlp.down_proj", id="flap-mlp"
    ),
    pytest.param(
        "llama", _mlp_block(1), "flap", {"mlp": 0.5, "allocation": "global"}, "model.layers.1",
        "model.layers.1.mlp.down_proj", id="flap-global",
    ),
    pytest.param(
        "llama", lambda m: _reads_old_width(m.model.layers[0].self_attn.o_proj, 32), "flap", {"heads": 0.5},
        "model.layers.0", "model.layers.0.self_attn.o_proj", id="flap-heads",
    ),
    # Stock OLMo-2: its q_norm normalizes every query head together, so it no longer runs once heads go.
    pytest.param(
        "olmo2", lambda m: None, "flap", {"heads": 0.5}, "model.layers.0", "model.layers.0.self_attn.q_norm",
        id="olmo2-heads",
    ),
    # magnitude_sp runs no calibration at all: the cuts are checked on one made-up batch.
    pytest.param(
        "llama", _mlp_block(1), "magnitude_sp", {"mlp": 0.5}, "model.layers.1", "model.layers.1.mlp.down_proj",
        id="magnitude_sp-without-calibration",
    ),
    # wanda_sp and reap run each block again, but not the last, and their failures spoke torch's words.
    pytest.param(
        "llama", _mlp_block(1), "wanda_sp", {"mlp": 0.5}, "model.layers.1", "model.layers.1.mlp.down_proj",
        id="wanda_sp-middle-block",
    ),
    pytest.param(
        "llama", _mlp_block(2), "wanda_sp", {"mlp": 0.5}, "model.layers.2", "model.layers.2.mlp.down_proj",
        id="wanda_sp-last-block",
    ),
    pytest.param(
        "mixtral", _router_of_last_block, "reap", {"experts": 0.5}, "model.layers.2", "model.layers.2.mlp.gate",
        id="reap-last-block",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("architecture", "change", "method", "options", "block", "module"), BREAKS_ONCE_CUT)
def test_a_block_that_breaks_once_cut_is_refused_naming_it_and_the_model_is_put_back(
    architecture: str, change: Callable[[nn.Module], None], method: str, options: dict[str, Any], block: str,
    module: str,
) -> None:  # fmt: skip
    model = build(architecture)
    change(model)
    calibration = None if method == "magnitude_sp" else calibration_ids()
    text = _refused(model, method, calibration, options, f"{block} fails its forward once cut: ")
    assert module in text and "The model is as it was." in text
    with torch.no_grad():
        assert model(calibration_ids(1, 8)).logits.shape == (1, 8, 64)  # the model as it was still runs


def test_a_block_that_fails_before_any_cut_is_named_in_one_line() -> None:
    model = build("llama")
    _reads_old_width(model.model.layers[1].mlp.down_proj, 40)  # the dense model itself fails here
    _refused(
        model, "wanda_sp", calibration_ids(), {"mlp": 0.5},
        "model.layers.1 fails its forward on the calibration data before its cut: model.layers.1.mlp.down_proj "
        "raised RuntimeError: The size of tensor a (48) must match the size of tensor b (40)",
    )  # fmt: skip


def _meta_everywhere() -> nn.Module:
    with torch.device("meta"):
        return build("llama")


def _one_block_on_meta() -> nn.Module:
    model = build("llama")
    model.model.layers[2].to("meta")
    return model


@pytest.mark.parametrize(
    ("make", "method", "first"),
    [
        (_meta_everywhere, "flap", "model.embed_tokens.weight"),
        (_meta_everywhere, "magnitude_sp", "model.embed_tokens.weight"),
        (_one_block_on_meta, "magnitude_sp", "model.layers.2.self_attn.q_proj.weight"),
    ],
    ids=["meta-everywhere-flap", "meta-everywhere-magnitude_sp", "one-block-on-meta"],
)
def test_a_model_on_the_meta_device_is_refused_up_front(make: Callable[[], nn.Module], method: str, first: str) -> None:
    model = make()
    parameters = dict(model.named_parameters())
    attributes = {name: dict(vars(module)) for name, module in model.named_modules()}
    config = model.config.to_dict()
    with pytest.raises(ValueError) as caught:
        prunereg.shrink(model, method, calibration_ids(), mlp=0.5)
    text = str(caught.value)
    assert text.startswith(f"the parameter {first} is on the meta device (no data)") and "\n" not in text
    assert "prunereg shrink --stream" in text
    assert all(parameter is parameters[name] for name, parameter in model.named_parameters())
    assert {name: dict(vars(module)) for name, module in model.named_modules()} == attributes
    assert model.config.to_dict() == config


def _share_block(model: nn.Module) -> None:
    model.model.layers[1] = model.model.layers[0]


def _share_down_proj_weight(model: nn.Module) -> None:
    model.model.layers[1].mlp.down_proj.weight = model.model.layers[0].mlp.down_proj.weight


SHARED = [
    pytest.param(
        "llama", lambda m: setattr(m.model.layers[1], "mlp", m.model.layers[0].mlp), "flap", {"mlp": 0.5},
        "model.layers.0.mlp and model.layers.1.mlp are one LlamaMLP object", id="an-mlp",
    ),
    pytest.param(
        "llama", lambda m: setattr(m.model.layers[2], "self_attn", m.model.layers[0].self_attn), "wanda_sp",
        {"heads": 0.5}, "model.layers.0.self_attn and model.layers.2.self_attn are one LlamaAttention object",
        id="an-attention",
    ),
    pytest.param(
        "llama", _share_block, "flap", {"mlp": 0.5}, "model.layers.0.mlp and model.layers.1.mlp are one LlamaMLP",
        id="a-block-narrowed",
    ),
    pytest.param(
        "llama", _share_block, "block_influence", {"layers": 1},
        "model.layers.0 and model.layers.1 are one LlamaDecoderLayer object", id="a-block-removed",
    ),
    pytest.param(
        "mixtral", lambda m: setattr(m.model.layers[1].mlp, "experts", m.model.layers[0].mlp.experts), "reap",
        {"experts": 0.5}, "model.layers.0.mlp.experts and model.layers.1.mlp.experts are one MixtralExperts",
        id="the-experts",
    ),
    # A shared Parameter came out as two untied copies without a word.
    pytest.param(
        "llama", _share_down_proj_weight, "magnitude_sp", {"mlp": 0.5},
        "model.layers.0.mlp.down_proj.weight and model.layers.1.mlp.down_proj.weight are one tensor (tied)",
        id="a-down_proj-parameter",
    ),
    pytest.param(
        "llama", lambda m: setattr(m.model.layers[0].mlp.up_proj, "weight", m.model.layers[0].mlp.gate_proj.weight),
        "flap", {"mlp": 0.5},
        "model.layers.0.mlp.gate_proj.weight and model.layers.0.mlp.up_proj.weight are one tensor (tied)",
        id="gate-and-up-in-one-block",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("architecture", "share", "method", "options", "message"), SHARED)
def test_a_module_or_tensor_shared_by_two_places_is_refused_naming_both(
    architecture: str, share: Callable[[nn.Module], None], method: str, options: dict[str, Any], message: str
) -> None:
    model = build(architecture)
    share(model)
    calibration = None if method == "magnitude_sp" else calibration_ids()
    _refused(model, method, calibration, options, message)


def test_the_tied_embedding_and_head_are_left_tied_and_shrink_as_before() -> None:
    model = tiny_llama(layers=3, tie_word_embeddings=True)
    prunereg.shrink(model, "flap", calibration_ids(), mlp=0.5, heads=0.5)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.config.intermediate_size == 24


ODD_PROJECTIONS = [
    pytest.param(
        lambda m: setattr(m.model.layers[1].mlp, "down_proj", nn.Identity()), {"mlp": 0.5},
        "cannot remove mlp of model.layers.1: LlamaMLP.down_proj (Identity) has no weight tensor, not a Linear's 2-D",
        id="down_proj-identity",
    ),
    pytest.param(
        lambda m: setattr(m.model.layers[1].mlp, "down_proj", nn.Conv1d(48, 32, 1)), {"mlp": 0.5},
        "cannot remove mlp of model.layers.1: LlamaMLP.down_proj (Conv1d) has a 3-D weight", id="down_proj-conv",
    ),
    pytest.param(
        lambda m: setattr(m.model.layers[1].mlp, "gate_proj", nn.Linear(32, 40, bias=False)), {"mlp": 0.5},
        "cannot remove mlp of model.layers.1: LlamaMLP.gate_proj.weight has 40 entries along dim 0, not the 48 of 48 "
        "channels (LlamaMLP.down_proj reads 48 inputs)", id="gate_proj-too-narrow",
    ),
    pytest.param(
        lambda m: setattr(m.model.layers[0].self_attn, "q_proj", nn.Linear(32, 24, bias=False)), {"heads": 0.5},
        "cannot remove heads of model.layers.0: LlamaAttention.q_proj.weight has 24 entries along dim 0, not the 32",
        id="q_proj-too-narrow",
    ),
    pytest.param(
        lambda m: setattr(m.model.layers[0].self_attn, "o_proj", nn.Identity()), {"heads": 0.5},
        "cannot remove heads of model.layers.0: LlamaAttention.o_proj (Identity) has no weight tensor",
        id="o_proj-identity",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("change", "options", "message"), ODD_PROJECTIONS)
def test_a_projection_shrink_cannot_cut_is_named_before_anything_changes(
    change: Callable[[nn.Module], None], options: dict[str, Any], message: str
) -> None:
    model = build("llama")
    change(model)
    _refused(model, "flap", calibration_ids(), options, message)


@pytest.fixture
def mlp_reading_its_old_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Llama MLP multiplies its intermediate activations by ``torch.ones(48)`` (a folder cannot hold a hook)."""

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x) * torch.ones(48))

    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", forward)


@pytest.mark.parametrize(("method", "calibration"), [("flap", calibration_ids()), ("magnitude_sp", None)])
@pytest.mark.usefixtures("mlp_reading_its_old_width")
def test_a_folder_whose_block_breaks_once_cut_writes_nothing(method: str, calibration: Any, tmp_path: Path) -> None:
    build("llama").save_pretrained(tmp_path / "dense")
    with pytest.raises(ValueError) as caught:
        prunereg.shrink_folder(tmp_path / "dense", tmp_path / "small", method, calibration, mlp=0.5)
    text = str(caught.value)
    assert text.startswith("model.layers.0 fails its forward once cut: model.layers.0.mlp raised RuntimeError")
    assert "The model is as it was" not in text  # a folder is not put back: it is never written
    assert not (tmp_path / "small").exists()
    assert [path.name for path in tmp_path.iterdir()] == ["dense"]


@pytest.mark.parametrize("stream", [[], ["--stream"]], ids=["in-memory", "stream"])
@pytest.mark.usefixtures("mlp_reading_its_old_width")
def test_the_command_says_which_block_breaks_once_cut_in_one_line_and_writes_nothing(
    stream: list[str], tmp_path: Path
) -> None:
    save_tiny_llama_folder(tmp_path / "dense")
    (tmp_path / "calibration.txt").write_text(random_text(200, seed=1))
    result = CliRunner().invoke(
        main,
        [
            "shrink", str(tmp_path / "dense"), str(tmp_path / "small"), "-m", "flap", "--mlp", "0.5",
            "--calibration", str(tmp_path / "calibration.txt"), "--samples", "4", "--seq-len", "16", *stream,
            "--quiet",  # the error alone: progress lines would come before it
        ],
    )  # fmt: skip
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: model.layers.0 fails its forward once cut: "), lines
    assert "model.layers.0.mlp raised RuntimeError" in lines[0]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["calibration.txt", "dense"]
