"""prunereg.slim across model zoos, with no hand configuration: does every model slim, and exactly?

    python benchmarks/slim_zoo.py                          # every model, a table printed
    python benchmarks/slim_zoo.py --models resnet18 vit_b_16 --json zoo.json

Per model (randomly initialised, eval mode, one small example input), three checks:

- **no-op**: ``slim(model, x)`` with no masks leaves every parameter, buffer and
  output bitwise as it was (it may only warn that it removed nothing);
- **masked**: whole rows of one middle layer (a quarter of its outputs, weight and
  bias) pruned by a mask, then ``slim(model, x)``: the outputs are the masked
  model's, or the refusal names what couples the layer (a residual add, ...);
- **ratio 0.5**: ``slim(model, x, ratio=0.5)`` keeps the output shapes; parameters
  before and after, and the modules kept whole (named in the report's notes).

Needs timm, torchvision and transformers (``pip install -c constraints.txt -e ".[bench,zoo]"``).
torchvision's wheel here is a CUDA build whose ``torchvision._meta_registrations``
fails to import on the CPU torch; benchmarks/slim.py keeps it from loading,
which every classification builder allows. :data:`ZOO` and :func:`check` are meant to be
reused by benchmarks/slim_zoo_peer.py (timings, Torch-Pruning beside it).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from slim import deadline  # noqa: E402  (benchmarks/slim.py: stops a slimming call that runs too long)

Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


def _torchvision(name: str, image: int = 64, **kwargs: Any) -> Callable[[], Built]:
    def build() -> Built:
        import torchvision.models as models

        return getattr(models, name)(weights=None, **kwargs).eval(), (torch.randn(1, 3, image, image),)

    return build


def _timm(name: str, image: int = 64, **kwargs: Any) -> Callable[[], Built]:
    def build() -> Built:
        import timm

        return timm.create_model(name, pretrained=False, **kwargs).eval(), (torch.randn(1, 3, image, image),)

    return build


def _hugging_face(kind: str, head: str = "ForCausalLM", **config: Any) -> Callable[[], Built]:
    def build() -> Built:
        import transformers

        made = getattr(transformers, f"{kind}Config")(**config)
        model = getattr(transformers, f"{kind}{head}")(made).eval()
        return model, (torch.randint(1, made.vocab_size, (1, 12)),)

    return build


_TEXT = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
_OPT = {"vocab_size": 128, "hidden_size": 32, "ffn_dim": 64, "num_hidden_layers": 2, "num_attention_heads": 4}

ZOO: dict[str, Callable[[], Built]] = {
    # torchvision classification builders
    "resnet18": _torchvision("resnet18"),
    "resnext50_32x4d": _torchvision("resnext50_32x4d"),
    "regnet_x_400mf": _torchvision("regnet_x_400mf"),
    "regnet_y_400mf": _torchvision("regnet_y_400mf"),
    "densenet121": _torchvision("densenet121"),
    "googlenet": _torchvision("googlenet", aux_logits=False, init_weights=True),
    "inception_v3": _torchvision("inception_v3", image=96, aux_logits=False, init_weights=True),
    "squeezenet1_1": _torchvision("squeezenet1_1"),
    "shufflenet_v2_x0_5": _torchvision("shufflenet_v2_x0_5"),
    "mobilenet_v2": _torchvision("mobilenet_v2"),
    "mobilenet_v3_small": _torchvision("mobilenet_v3_small"),
    "efficientnet_b0": _torchvision("efficientnet_b0"),
    "mnasnet0_5": _torchvision("mnasnet0_5"),
    "convnext_tiny": _torchvision("convnext_tiny"),
    "alexnet": _torchvision("alexnet"),
    "vit_b_16": _torchvision("vit_b_16", image=64, image_size=64),
    "swin_t": _torchvision("swin_t"),
    "maxvit_t": _torchvision("maxvit_t", image=224),
    "resnet50": _torchvision("resnet50"),
    "wide_resnet50_2": _torchvision("wide_resnet50_2"),
    "vgg11_bn": _torchvision("vgg11_bn"),
    "mobilenet_v3_large": _torchvision("mobilenet_v3_large"),
    "efficientnet_v2_s": _torchvision("efficientnet_v2_s"),
    "shufflenet_v2_x1_0": _torchvision("shufflenet_v2_x1_0"),
    "mnasnet1_0": _torchvision("mnasnet1_0"),
    "squeezenet1_0": _torchvision("squeezenet1_0"),
    "regnet_y_800mf": _torchvision("regnet_y_800mf"),
    "swin_v2_t": _torchvision("swin_v2_t"),
    "vit_b_32": _torchvision("vit_b_32", image=64, image_size=64),
    # timm
    "timm_vit_tiny": _timm("vit_tiny_patch16_224", img_size=64),
    "timm_deit_tiny": _timm("deit_tiny_patch16_224", img_size=64),
    "timm_mixer_s16": _timm("mixer_s16_224", img_size=64),
    "timm_coat_lite_tiny": _timm("coat_lite_tiny", img_size=64),
    "timm_edgenext_xx_small": _timm("edgenext_xx_small"),
    "timm_mobilevit_xxs": _timm("mobilevit_xxs"),
    "timm_resnest14d": _timm("resnest14d"),
    "timm_dla34": _timm("dla34"),
    "timm_cspresnet50": _timm("cspresnet50"),
    "timm_res2net50_14w_8s": _timm("res2net50_14w_8s"),
    "timm_rexnet_100": _timm("rexnet_100"),
    "timm_ghostnet_100": _timm("ghostnet_100"),
    "timm_resnet18": _timm("resnet18"),
    "timm_convnext_atto": _timm("convnext_atto"),
    "timm_regnetx_002": _timm("regnetx_002"),
    "timm_efficientnet_b0": _timm("efficientnet_b0"),
    "timm_levit_128s": _timm("levit_128s", image=224),
    "timm_pvt_v2_b0": _timm("pvt_v2_b0"),
    "timm_poolformer_s12": _timm("poolformer_s12"),
    "timm_resmlp_12": _timm("resmlp_12_224", img_size=64),
    "timm_gmlp_ti16": _timm("gmlp_ti16_224", img_size=64),
    "timm_cait_xxs24": _timm("cait_xxs24_224", img_size=64),
    "timm_xcit_nano_12_p16": _timm("xcit_nano_12_p16_224", img_size=64),
    "timm_efficientformer_l1": _timm("efficientformer_l1", image=224),
    "timm_hrnet_w18_small": _timm("hrnet_w18_small"),
    "timm_dpn68": _timm("dpn68"),
    "timm_nfnet_l0": _timm("nfnet_l0"),
    "timm_repvgg_a0": _timm("repvgg_a0"),
    "timm_mobileone_s0": _timm("mobileone_s0"),
    "timm_fastvit_t8": _timm("fastvit_t8"),
    "timm_inception_v4": _timm("inception_v4", image=96),
    "timm_tinynet_a": _timm("tinynet_a"),
    "timm_convmixer_768_32": _timm("convmixer_768_32"),
    "timm_swin_tiny": _timm("swin_tiny_patch4_window7_224", img_size=64, window_size=2),
    # Hugging Face causal LMs from configs
    "hf_llama": _hugging_face("Llama", **_TEXT, num_attention_heads=4, num_key_value_heads=2),
    "hf_qwen2": _hugging_face("Qwen2", **_TEXT, num_attention_heads=4, num_key_value_heads=2),
    "hf_mistral": _hugging_face("Mistral", **_TEXT, num_attention_heads=4, num_key_value_heads=1),
    "hf_gemma2": _hugging_face("Gemma2", **_TEXT, num_attention_heads=4, num_key_value_heads=2, head_dim=8),
    "hf_gpt2": _hugging_face("GPT2", "LMHeadModel", vocab_size=128, n_embd=32, n_layer=2, n_head=4),
    "hf_phi3": _hugging_face("Phi3", **_TEXT, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0),
    "hf_gemma": _hugging_face("Gemma", **_TEXT, num_attention_heads=4, num_key_value_heads=1, head_dim=8),
    "hf_qwen3": _hugging_face("Qwen3", **_TEXT, num_attention_heads=4, num_key_value_heads=2, head_dim=8),
    "hf_olmo2": _hugging_face("Olmo2", **_TEXT, num_attention_heads=4, num_key_value_heads=2),
    "hf_opt": _hugging_face("OPT", **_OPT),
    "hf_gpt_neox": _hugging_face("GPTNeoX", **_TEXT, num_attention_heads=4),
    "hf_falcon": _hugging_face("Falcon", vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
    "hf_mixtral": _hugging_face(
        "Mixtral", **_TEXT, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2
    ),
}
"""Each model by name: a builder of ``(model in eval mode, example inputs)``."""


def _outputs(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    with torch.no_grad():
        out = model(*inputs)
    if hasattr(out, "logits"):
        out = out.logits
    return [leaf for leaf in tree_leaves(out) if isinstance(leaf, torch.Tensor)]


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _same_state(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    after = model.state_dict()
    return after.keys() == before.keys() and all(
        after[k].shape == v.shape
        and torch.equal(after[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8))
        for k, v in before.items()
    )


def _close(a: list[torch.Tensor], b: list[torch.Tensor], exact: bool = False) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape
        and (torch.equal(x, y) if exact else float((x - y).abs().max()) <= 1e-5 + 1e-4 * float(x.abs().max()))
        for x, y in zip(a, b, strict=True)
    )


def forward_kwargs(model: nn.Module) -> dict[str, Any]:
    """Keyword arguments of a forward that only computes: a Hugging Face model keeps no cache."""
    return {"use_cache": False} if hasattr(getattr(model, "config", None), "use_cache") else {}


def _mask_a_quarter_of_a_group(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> str | None:
    """Masks pruning a quarter of the units of the model's middle removable group, in every tensor holding them.

    The group comes from slimming's own graph, so the masks prune what can go
    (in every layer making the units, their biases and norms; the layers reading
    them keep their columns): ``slim`` must then give the masked outputs exactly.
    A layer norm counting the units is the one rightful refusal. Returns the
    first tensor masked, or ``None`` when no group has four units.
    """
    import prunereg
    from prunereg._slim.graph import build_graph, capture_model
    from prunereg._slim.groups import find_groups

    graph = build_graph(model, capture_model(model, inputs, forward_kwargs(model)))
    groups = [group for group in find_groups(graph) if len(group.removable) >= 4]
    if not groups:
        return None
    group = groups[len(groups) // 2]
    removable = group.removable
    gone = torch.tensor(removable[::4][: len(removable) // 4])  # every fourth unit
    parameters = dict(model.named_parameters())
    masked: list[str] = []
    for (name, dim), unit_index in group.members.items():
        if (name, dim) in graph.consumers or name not in parameters:
            continue
        owner, _, attribute = name.rpartition(".")
        tensor = parameters[name]
        rows = torch.isin(unit_index, gone)
        shape = [1] * tensor.dim()
        shape[dim] = -1
        mask = (~rows).to(tensor.dtype).reshape(shape).expand_as(tensor).clone()
        prunereg.get("custom_from_mask").apply(model.get_submodule(owner), attribute, mask=mask)
        masked.append(name)
    return masked[0] if masked else None


def _said(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]


def no_op_check(model: nn.Module, inputs: tuple[torch.Tensor, ...], timeout: int) -> str:
    """``slim(model, inputs)`` with no masks: ``ok`` if every tensor and output is bitwise as it was."""
    import prunereg

    state, dense = _state(model), _outputs(model, inputs)
    try:
        with deadline(timeout):
            prunereg.slim(model, inputs)
        same = _same_state(model, state) and _close(_outputs(model, inputs), dense, exact=True)
    except Exception as error:
        return f"refused: {_said(error)}"
    return "ok" if same else "CHANGED"


def masked_check(model: nn.Module, inputs: tuple[torch.Tensor, ...], timeout: int) -> str:
    """A quarter of a middle group masked, then ``slim``: ``ok (...)`` if the outputs are the masked model's."""
    import prunereg

    try:
        first = _mask_a_quarter_of_a_group(model, inputs)
    except Exception as error:  # the graph itself: the no-op says so too
        return f"refused: {_said(error)}"
    if first is None:
        return "no group of four units"
    masked = _outputs(model, inputs)
    try:
        with deadline(timeout):
            report = prunereg.slim(model, inputs)
    except Exception as error:
        return f"refused ({first}): {_said(error)}"
    return f"ok ({first}: {report.removed} removed)" if _close(_outputs(model, inputs), masked) else "DIFFERENT"


def check(name: str, timeout: int = 600) -> dict[str, Any]:
    """The three checks on model ``name``: a dict of what each found (``ok``, or why not)."""
    import prunereg

    result: dict[str, Any] = {"model": name}
    torch.manual_seed(0)
    try:
        model, inputs = ZOO[name]()
    except Exception as error:  # a builder this torchvision or timm does not have
        return {**result, "build": _said(error)}
    pristine = copy.deepcopy(model)
    result["params"] = sum(p.numel() for p in model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result["no_op"] = no_op_check(model, inputs, timeout)
        result["masked"] = masked_check(copy.deepcopy(pristine), inputs, timeout)
        # ratio 0.5
        model = copy.deepcopy(pristine)
        shapes = [o.shape for o in _outputs(model, inputs)]
        start = time.perf_counter()
        try:
            with deadline(timeout):
                report = prunereg.slim(model, inputs, ratio=0.5)
            ran = [o.shape for o in _outputs(model, inputs)]
            kept = [note.split(":")[0] for note in report.notes if note.startswith("kept ")]
            result["ratio"] = "ok" if ran == shapes else f"SHAPE {ran}"
            result["params_after"] = report.params_after
            result["kept_whole"] = kept
        except Exception as error:
            result["ratio"] = f"refused: {_said(error)}"
        result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(ZOO), help="models to check (default: all)")
    parser.add_argument("--json", type=Path, help="write the results here (one object per model), as they come")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per slim call before it counts as hung")
    options = parser.parse_args()
    torch.set_num_threads(2)
    results = []
    for name in options.models:
        result = check(name, options.timeout)
        results.append(result)
        print(json.dumps(result), flush=True)
        if options.json:
            options.json.write_text(json.dumps(results, indent=1))
    print(f"\n{'model':28} {'no-op':8} {'masked':8} {'ratio 0.5':10} kept whole")
    for r in results:
        said = {
            key: str(r.get(key, r.get("build", "?"))).split(" ")[0].rstrip(":") for key in ("no_op", "masked", "ratio")
        }
        kept = ", ".join(r.get("kept_whole", []))
        print(f"{r['model']:28} {said['no_op']:8} {said['masked']:8} {said['ratio']:10} {kept}")


if __name__ == "__main__":
    main()
