"""Width attributes: sizes a module keeps outside its tensors (``self.num_heads``), set true after the cut.

A module may read a width from an attribute rather than from a tensor:
timm's ``Attention`` reshapes its ``qkv`` output by ``self.num_heads`` and
``self.head_dim``. After slimming removes heads, such attributes must say the
new widths, or the module computes something else. Two rules set them:

- **heads, by name**: a module that reshapes a tensor into heads which lose
  heads gets every int attribute named as a head count (``num_heads``,
  ``n_heads``, ``num_attention_heads``, ``n_head``, ``heads``,
  ``num_key_value_heads``) that held the old count set to the new one, and one
  named as the heads' total width (``attn_dim``, ``all_head_size``,
  ``inner_dim``) that held it set to the new total. Heads go whole, so their
  width (``head_dim``) stays.
- **widths, by name**: a module whose own tensors lose positions along a
  dimension gets every int attribute named as a width (``hidden_dim``,
  ``intermediate_dim``, ``hidden_size``, ``intermediate_size``: how
  transformers' routers and fused experts hold theirs) that held that
  dimension's old size set to the new one, where the module's dimensions of
  that size all change alike.
- **by class**, for any other attribute: :func:`register_width_rule` says,
  for a module class, how to compute an attribute from the slimmed module.

Whatever a rule sets, the slimmed model is then checked against the plan
(:mod:`.verify`), so a wrong or missing rule is caught, never silent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from prunereg._slim.graph import DependencyGraph

WidthRule = Callable[[nn.Module], int]
"""Computes one attribute's new value from the module, its tensors already cut."""

HEAD_COUNTS = ("num_heads", "n_heads", "num_attention_heads", "n_head", "heads", "num_key_value_heads")
HEADS_WIDTH = ("attn_dim", "all_head_size", "inner_dim")
WIDTHS = ("hidden_dim", "intermediate_dim", "hidden_size", "intermediate_size")
HEAD_WIDTHS = ("head_dim", "head_size", "attention_head_size", "dim_head")
"""Names of one head's width, which slimming never changes (heads go whole)."""

_RULES: dict[str, dict[str, WidthRule]] = {}
"""Class (``module.QualifiedName``) to attribute name to its rule."""


def register_width_rule(module_class: type[nn.Module] | str, **attributes: WidthRule) -> None:
    """After slimming, set ``attribute`` of every module of ``module_class`` to ``rule(module)``.

    ``module_class``: the class, or its ``"package.module.ClassName"`` (a rule
    for a library that need not be installed); subclasses follow it. Each rule
    is called on the slimmed module, whose own tensors and layers (``in_features``,
    ``out_channels``...) are already cut, and returns the attribute's new int::

        prunereg.register_width_rule(MyAttention, num_heads=lambda m: m.out.in_features // m.head_dim)

    Registering an attribute of a class again replaces its rule.
    """
    if isinstance(module_class, type):
        if not issubclass(module_class, nn.Module):
            raise TypeError(f"register_width_rule needs an nn.Module class, not {module_class.__name__}")
        name = _qualified(module_class)
    elif isinstance(module_class, str) and "." in module_class:
        name = module_class
    else:
        raise TypeError(
            f"register_width_rule needs an nn.Module class or its 'package.module.Class' name, not {module_class!r}"
        )
    if not attributes:
        raise ValueError(f"register_width_rule({name!r}) names no attribute: pass attribute=rule")
    for attribute, rule in attributes.items():
        if not callable(rule):
            raise TypeError(f"the rule for {name}.{attribute} must be callable(module) -> int, not {rule!r}")
    _RULES.setdefault(name, {}).update(attributes)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def sync_width_attributes(
    model: nn.Module, graph: DependencyGraph, removed: set[int], touched: Iterable[str]
) -> list[str]:
    """Set the width attributes of ``model``'s modules by the two rules; the ``module.attribute`` names set."""
    kept = graph.kept(removed)
    proposals: dict[tuple[str, str], set[int]] = {}
    for path, heads, width in graph.head_splits:
        before, after = heads.numel(), int(kept[heads].sum())
        if before == after:
            continue
        module = model.get_submodule(path)
        for attribute, value in vars(module).items():
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            if attribute in HEAD_COUNTS and value == before:
                proposals.setdefault((path, attribute), set()).add(after)
            elif attribute in HEADS_WIDTH and value == before * width:
                proposals.setdefault((path, attribute), set()).add(after * width)
    _widths_by_name(model, graph, kept, proposals)
    changed: list[str] = []
    for (path, attribute), values in proposals.items():
        if len(values) == 1:  # two head splits that disagree leave it: the check after the cut names the module
            setattr(model.get_submodule(path), attribute, next(iter(values)))
            changed.append(f"{path}.{attribute}")
    changed += _by_class(model, set(touched))
    return changed


def _widths_by_name(
    model: nn.Module, graph: DependencyGraph, kept: torch.Tensor, proposals: dict[tuple[str, str], set[int]]
) -> None:
    """Propose the new value of each width attribute (:data:`WIDTHS`) whose module's own tensors lost positions."""
    sizes: dict[str, dict[int, set[int]]] = {}
    for name, dims in graph.tensors.items():
        path = name.rpartition(".")[0]
        for ids in dims:
            before, after = ids.numel(), int(kept[ids].sum())
            sizes.setdefault(path, {}).setdefault(before, set()).add(after)
    for path, by_size in sizes.items():
        module = model.get_submodule(path)
        for attribute in WIDTHS:
            value = getattr(module, attribute, None)
            if isinstance(value, bool) or not isinstance(value, int) or value not in by_size:
                continue
            if len(by_size[value]) == 1 and value not in by_size[value]:
                proposals.setdefault((path, attribute), set()).update(by_size[value])


def _by_class(model: nn.Module, touched: set[str]) -> list[str]:
    changed: list[str] = []
    if not _RULES:
        return changed
    above_touched = {""} if touched else set()  # a touched module, and every module holding one
    for name in touched:
        parts = name.split(".")
        above_touched.update(".".join(parts[:end]) for end in range(1, len(parts) + 1))
    for path, module in model.named_modules():
        if path not in above_touched:
            continue
        for cls in type(module).__mro__:
            rules = _RULES.get(_qualified(cls))
            if rules is None:
                continue
            for attribute, rule in rules.items():
                value = rule(module)
                if isinstance(value, (torch.Tensor, bool)) or not isinstance(value, int):
                    raise TypeError(
                        f"the width rule for {_qualified(cls)}.{attribute} gave {value!r} for '{path}', not an int"
                    )
                setattr(module, attribute, value)
                changed.append(f"{path}.{attribute}" if path else attribute)
            break
    return changed


# Built-in rules, by class path (the libraries need not be installed) ---------------------------------------------
def _channels(module: nn.Module, path: str, attribute: str) -> int:
    """An int attribute of the submodule at ``path`` (its modules untyped: the library need not be installed)."""
    value = getattr(module.get_submodule(path), attribute)
    return int(value)


for _stage in ("timm.models.cspnet.CrossStage", "timm.models.cspnet.CrossStage3"):
    # a CSP stage splits its expanded channels in two by self.expand_chs // 2
    register_width_rule(_stage, expand_chs=lambda stage: _channels(stage, "conv_exp.conv", "out_channels"))
# a Res2Net bottleneck splits its channels into parts of self.width, one 3x3 convolution each
register_width_rule("timm.models.res2net.Bottle2neck", width=lambda block: _channels(block, "convs.0", "in_channels"))
for _attention in ("timm.models.levit.Attention", "timm.models.levit.AttentionDownsample"):
    # LeViT reshapes its attention's output by self.val_attn_dim, every head's values side by side
    register_width_rule(
        _attention,
        key_attn_dim=lambda attention: _channels(attention, "", "key_dim") * _channels(attention, "", "num_heads"),
        val_attn_dim=lambda attention: _channels(attention, "", "val_dim") * _channels(attention, "", "num_heads"),
    )
