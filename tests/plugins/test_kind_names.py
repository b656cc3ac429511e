"""One name space for every kind, and no kind ever evicts another's name, ``replace=True`` or not (issue 31)."""

from __future__ import annotations

import pytest
import torch

import prunereg
from tests.plugins.test_registry import FAKES, register, registry_with_plugins


class _Zeros(prunereg.Importance):
    """Every unit scores zero."""

    def __call__(self, group, values):  # type: ignore[no-untyped-def]
        return torch.zeros(group.size, dtype=torch.float64)


@pytest.mark.usefixtures("fresh_registry")
@pytest.mark.parametrize("replace", [False, True])
def test_an_importance_named_like_a_method_is_refused_and_the_method_keeps_working(replace: bool) -> None:
    with pytest.raises(ValueError, match=r"^'magnitude' is the calibrated method of plugin 'llm' .*another name$"):
        prunereg.register_importance("magnitude", replace=True)(_Zeros)
    with pytest.raises(ValueError, match=r"^'wanda' is the calibrated method of plugin 'llm'") as raised:
        prunereg.register("wanda", kind="importance", replace=replace)(_Zeros)
    assert "\n" not in str(raised.value)
    assert prunereg.get("magnitude").PRUNING_TYPE == "calibrated"
    assert prunereg.info("wanda").kind == "calibrated" and "magnitude" not in prunereg.list_methods("importance")


def test_an_installed_plugin_taking_a_name_of_another_kind_is_a_conflict_even_with_replace() -> None:
    registry = registry_with_plugins("a", "b")
    register(registry, "keep", plugin="a")
    register(registry, "keep", plugin="b", target=FAKES + ":DropFirstChannel", kind="structured", replace=True)
    assert registry.info("keep").plugin == "a" and registry.info("b:keep").kind == "structured"
    [clash] = registry.problems
    assert "'keep' is the unstructured method of plugin 'a'" in clash and "reach this one as 'b:keep'" in clash
    assert registry.plugins["b"].status == "conflict"


def test_replace_still_takes_a_name_of_the_same_kind() -> None:
    registry = registry_with_plugins("a", "b")
    register(registry, "keep", plugin="a")
    register(registry, "keep", plugin="b", target=FAKES + ":DropFirstChannel", replace=True)
    assert registry.info("keep").plugin == "b" and registry.problems == []
