"""Widths stated outside the tensors: attention modules' head counts and Hugging Face configs.

After the tensors are cut (:mod:`.surgery` keeps each layer's own size
attributes true), an attention module may still hold its old head count or
width (``nn.MultiheadAttention.embed_dim``, GPT-2's ``split_size``, BERT's
``all_head_size``): :func:`sync_attention` sets them from its projections,
and :func:`width_readers` names a module whose old width made the slimmed model fail.
:func:`rewrite_config` then states the new widths in a Hugging Face config
when the config can (every layer alike): a model built from the rewritten
config must have exactly the slimmed shapes, or the config is left as it was
and the record of shapes goes into it instead (``prunereg_slimmed``).
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Callable, Collection
from typing import Any

import torch
from torch import Tensor, nn

from prunereg._models.slimmed import CONFIG_KEY, Record, slimmed_shapes

_QUERY = ("q_proj", "query", "q", "q_lin", "to_q", "wq")
_KEY = ("k_proj", "key", "k", "k_lin", "to_k", "wk")
_HEAD_COUNTS = ("num_heads", "num_attention_heads", "n_heads", "n_head")


def _width(module: nn.Module | None) -> int | None:
    weight = getattr(module, "weight", None)
    if isinstance(module, nn.Linear) and isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor):
        return int(weight.shape[1])
    return None


def head_counts(module: nn.Module) -> tuple[int, int | None] | None:
    """``(query heads, key/value heads)`` of an attention module with a ``head_dim``, from its projections."""
    head_dim = getattr(module, "head_dim", getattr(module, "attention_head_size", None))
    if not isinstance(head_dim, int) or head_dim <= 0:
        return None
    query = next((getattr(module, n) for n in _QUERY if isinstance(getattr(module, n, None), nn.Module)), None)
    fused = getattr(module, "c_attn", None)
    if query is not None and _width(query) is not None:
        width = _width(query)
        key = next((getattr(module, n) for n in _KEY if isinstance(getattr(module, n, None), nn.Module)), None)
        kv = _width(key)
        return width // head_dim, (kv // head_dim if kv is not None else None)  # type: ignore[operator]
    if fused is not None and _width(fused) is not None:
        heads = _width(fused) // (3 * head_dim)  # type: ignore[operator]
        return heads, heads
    return None


def sync_attention(module: nn.Module) -> None:
    """Set an attention module's head counts and widths from its (cut) projections."""
    if isinstance(module, nn.MultiheadAttention):
        weight = (
            module.in_proj_weight if module.in_proj_weight is not None else getattr(module, "in_proj_weight_orig", None)
        )
        if isinstance(weight, torch.Tensor):
            module.embed_dim = module.kdim = module.vdim = int(weight.shape[1])
            module.num_heads = module.embed_dim // module.head_dim
        return
    counts = head_counts(module)
    if counts is None:
        return
    heads, kv_heads = counts
    head_dim = getattr(module, "head_dim", getattr(module, "attention_head_size", 0))
    widths = {name: heads for name in _HEAD_COUNTS}
    widths.update(all_head_size=heads * head_dim, split_size=heads * head_dim)
    if kv_heads:
        widths["num_key_value_heads"] = kv_heads
    output = _width(getattr(module, "c_proj", None))
    if output is not None:
        widths["embed_dim"] = output  # GPT-2's attention: its output width
    for name, value in widths.items():
        if isinstance(getattr(module, name, None), int):
            setattr(module, name, value)


def width_readers(error: BaseException, model: nn.Module, widths: Collection[int]) -> tuple[str, dict[str, int]]:
    """The submodule whose code failed with ``error`` reading int attributes of old widths: its name, and them.

    A module that reads ``self.num_heads`` (or any size it holds) sees the size
    slimming cut from its tensors only where :func:`sync_attention` knows it.
    The traceback is read from the innermost frame out; the first frame whose
    ``self`` is a submodule of ``model`` and whose code reads int attributes of
    it holding sizes in ``widths`` (those slimming changed) names them, in the
    order the code first reads them. ``("", {})`` when no frame does.
    """
    names = {id(module): name for name, module in model.named_modules() if name}
    for frame, _ in reversed(list(traceback.walk_tb(error.__traceback__))):
        owner = frame.f_locals.get("self")
        if not isinstance(owner, nn.Module) or id(owner) not in names:
            continue
        attributes = {name: vars(owner).get(name) for name in frame.f_code.co_names}
        read = {
            name: value
            for name, value in attributes.items()
            if isinstance(value, int) and not isinstance(value, bool) and value in widths
        }
        if read:
            return names[id(owner)], read
    return "", {}


_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "embedding_size")
_PER_STAGE = ("hidden_sizes",)
_INTERMEDIATE = (
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "d_ff",
    "hidden_dim",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "q_lora_rank",
)
_CONFIG_HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
_CONFIG_KV = ("num_key_value_heads", "n_kv_heads", "num_kv_heads")


def rewrite_config(
    model: nn.Module, before: Record, run: Callable[[nn.Module], list[Tensor]] | None, expected: list[Tensor]
) -> bool:
    """State the slimmed widths in ``model.config`` if a model built from it is this one.

    A model built from the rewritten config must have exactly the slimmed
    shapes and, given these weights, compute ``expected`` again with ``run``
    (Gemma scales by the square root of ``hidden_size``: a config can state
    the shapes and still change what the model computes); with ``run=None``
    (a model whose weights are not in memory), the shapes and the buffers a model
    computes from its config (:func:`_computes_the_same_buffers`). Otherwise the
    config keeps its fields and gets the record of shapes as
    ``prunereg_slimmed``, which :func:`prunereg.from_pretrained` applies.
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict") or not isinstance(model, nn.Module):
        return False
    shapes = slimmed_shapes(model)
    if not shapes["tensors"]:
        return False
    candidate = copy.deepcopy(config)
    if hasattr(candidate, CONFIG_KEY):
        delattr(candidate, CONFIG_KEY)
    for key, value in _derived_fields(model, config, before).items():
        setattr(candidate, key, value)
    if _is_this_model(model, candidate, run, expected):
        for key, value in candidate.__dict__.items():
            setattr(config, key, value)
        if hasattr(config, CONFIG_KEY):
            delattr(config, CONFIG_KEY)
        return True
    setattr(config, CONFIG_KEY, _plain_record(shapes))
    return False


def _plain_record(shapes: Record) -> Record:
    """The record under the names a fresh model has: a pruned tensor's ``_orig`` as its plain name, no masks."""
    tensors = {
        name.removesuffix("_orig"): shape for name, shape in shapes["tensors"].items() if not name.endswith("_mask")
    }
    return {"tensors": tensors, "attributes": shapes["attributes"]}


def _derived_fields(model: nn.Module, config: Any, before: Record) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    new_sizes: dict[int, set[int]] = {}
    after = {
        name: list(t.shape)
        for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    }
    for name, old in before["tensors"].items():
        new = after.get(name)
        if new is None or len(new) != len(old):
            continue
        for a, b in zip(old, new, strict=True):
            if a != b:
                new_sizes.setdefault(a, set()).add(b)
    hidden_old = next((getattr(config, k) for k in _HIDDEN if isinstance(getattr(config, k, None), int)), None)
    embedding = _input_embedding(model)
    if embedding is not None and hidden_old is not None:
        # the residual width is the embedding's (query projections of as many channels change differently)
        name, width = embedding
        if before["tensors"].get(name, [0, 0])[1] == hidden_old:
            new_sizes[hidden_old] = {width}
    for keys in (_HIDDEN, _INTERMEDIATE):
        for key in keys:
            old = getattr(config, key, None)
            if key == "n_inner" and old is None and hidden_old is not None:
                old = 4 * hidden_old  # GPT-2's default MLP width
            if isinstance(old, int) and len(new_sizes.get(old, ())) == 1:
                fields[key] = next(iter(new_sizes[old]))
    for key in _PER_STAGE:  # a width per stage (ResNet's hidden_sizes)
        old = getattr(config, key, None)
        if isinstance(old, list) and old and all(len(new_sizes.get(v, ())) <= 1 for v in old if isinstance(v, int)):
            fields[key] = [next(iter(new_sizes[v])) if v in new_sizes else v for v in old]
    counts = {c for c in (head_counts(m) for m in model.modules()) if c is not None}
    if len(counts) == 1:
        heads, kv_heads = next(iter(counts))
        head_dim = next(
            getattr(m, "head_dim", getattr(m, "attention_head_size", None)) for m in model.modules() if head_counts(m)
        )
        for key in _CONFIG_HEADS:
            if isinstance(getattr(config, key, None), int):
                fields[key] = heads
        for key in _CONFIG_KV:
            if isinstance(getattr(config, key, None), int) and kv_heads:
                fields[key] = kv_heads
        if heads and head_dim and getattr(config, "head_dim", None) is None:
            fields["head_dim"] = head_dim
    return fields


def _input_embedding(model: nn.Module) -> tuple[str, int] | None:
    """The name and width of a model's input embedding weight (a Hugging Face model's ``get_input_embeddings``)."""
    getter = getattr(model, "get_input_embeddings", None)
    try:
        embedding = getter() if callable(getter) else None
    except (NotImplementedError, AttributeError):
        return None
    if not isinstance(embedding, nn.Embedding):
        return None
    name = next((n for n, p in model.named_parameters(remove_duplicate=False) if p is embedding.weight), None)
    return (name, embedding.embedding_dim) if name is not None else None


def _saveable(candidate: Any) -> bool:
    """Whether transformers would save and load ``candidate``: a model builds from a config its checks refuse.

    ``setattr`` skips a config's validation (a hidden size that is no multiple
    of the head count, say), which ``save_pretrained`` and ``from_pretrained``
    then run; such a config is not stated, the shapes are recorded instead.
    """
    validate = getattr(candidate, "validate", None)
    try:
        if callable(validate):
            validate()
        type(candidate).from_dict(candidate.to_dict())
    except Exception:  # whatever transformers' checks raise, the config cannot be saved as it is
        return False
    return True


def _is_this_model(
    model: nn.Module, candidate: Any, run: Callable[[nn.Module], list[Tensor]] | None, expected: list[Tensor]
) -> bool:
    """Whether a model built from ``candidate`` has the slimmed shapes and, with these weights, computes ``expected``.

    One model is built, without memory for its parameters; it takes the
    slimmed model's weights (shared, not copied) and computes its buffers as a
    reloaded model would. Without accelerate no second model can run: the shapes alone are checked.
    """
    try:
        from accelerate import init_empty_weights
    except ImportError:
        empty, runnable = torch.device("meta"), False
    else:
        empty, runnable = init_empty_weights(include_buffers=False), True
    if not _saveable(candidate):
        return False
    try:
        with empty:
            fresh = type(model)(candidate)
    except Exception:  # a config the model cannot be built from is not this one
        return False
    if _plain_shapes(fresh) != _plain_shapes(model):
        return False
    if not runnable:
        return True
    if run is None:
        return _computes_the_same_buffers(model, fresh)
    try:
        fresh.load_state_dict(_plain_state(model), assign=True, strict=True)
        if any(t.is_meta for t in [*fresh.parameters(), *fresh.buffers()]):
            return False
        got = run(fresh.eval())
    except Exception:  # a model the config cannot run is not this one
        return False
    return len(got) == len(expected) and all(
        a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, expected, strict=True)
    )


def _computes_the_same_buffers(model: nn.Module, fresh: nn.Module) -> bool:
    """Whether ``fresh`` computes from its config the buffers a model built from ``model``'s config computes.

    For a model whose weights are not in memory (it cannot run): a config that
    states the shapes can still change what the model computes through the
    buffers built from it (Gemma's ``embed_scale``, the square root of
    ``hidden_size``). The buffers not saved with the weights are compared, in
    shape and value; both models are built with real buffers and empty weights.
    """
    from accelerate import init_empty_weights

    try:
        with init_empty_weights(include_buffers=False):
            before = type(model)(copy.deepcopy(model.config))
    except Exception:  # a config the model cannot be built from again: not known to be the same
        return False
    saved = set(fresh.state_dict())
    expected = dict(before.named_buffers())
    return all(
        name in expected and expected[name].shape == buffer.shape and torch.equal(expected[name], buffer)
        for name, buffer in fresh.named_buffers()
        if name not in saved
    )


def _plain_state(model: nn.Module) -> dict[str, Tensor]:
    """The state dict with a pruned tensor as its masked value under its plain name."""
    state = model.state_dict()
    plain: dict[str, Tensor] = {}
    for name, tensor in state.items():
        if name.endswith("_mask"):
            continue
        if name.endswith("_orig"):
            mask = state.get(name[: -len("_orig")] + "_mask")
            plain[name.removesuffix("_orig")] = tensor * mask.to(tensor.dtype) if mask is not None else tensor
        else:
            plain[name] = tensor
    return plain


def _plain_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """State-dict shapes with a pruned tensor under its plain name (masks left out)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("_mask"):
            continue
        shapes[name.removesuffix("_orig")] = tuple(tensor.shape)
    return shapes
