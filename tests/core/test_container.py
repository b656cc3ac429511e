"""PruningContainer: each new method acts only on what the earlier ones left."""

from __future__ import annotations

import pytest
import torch

from prunereg import BasePruningMethod, PruningContainer
from prunereg.prune import CustomFromMask, L1Unstructured, LnStructured, RandomStructured


def named(method: BasePruningMethod, name: str = "w") -> BasePruningMethod:
    method._tensor_name = name
    return method


def container_of(*methods: BasePruningMethod) -> PruningContainer:
    container = PruningContainer()
    container._tensor_name = "w"
    for method in methods:
        container.add_pruning_method(named(method))
    return container


T = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
PRIOR = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 1.0]])


def test_sequence_protocol():
    a, b = named(L1Unstructured(1)), named(LnStructured(1, 2, 0))
    container = PruningContainer(a, b)
    assert len(container) == 2
    assert list(container) == [a, b]
    assert container[0] is a and container[-1] is b


def test_several_methods_at_construction_take_the_first_name():
    # torch raises AttributeError here: it sets the name only for a single method.
    container = PruningContainer(named(L1Unstructured(1)), named(L1Unstructured(2)))
    assert container._tensor_name == "w"
    with pytest.raises(ValueError, match="'w'"):
        PruningContainer(named(L1Unstructured(1)), named(L1Unstructured(2), "v"))


@pytest.mark.parametrize("thing", [10, "ugh", object(), L1Unstructured])
def test_adding_a_non_method_is_a_type_error(thing):
    with pytest.raises(TypeError, match="not a BasePruningMethod"):
        container_of().add_pruning_method(thing)


def test_adding_a_method_for_another_tensor_is_a_value_error():
    container = container_of(L1Unstructured(1))
    with pytest.raises(ValueError, match="another"):
        container.add_pruning_method(named(L1Unstructured(1), "another"))
    assert len(container) == 1


def test_unstructured_acts_on_the_entries_left():
    mask = container_of(L1Unstructured(amount=2)).compute_mask(T, PRIOR)
    assert torch.equal(mask, torch.tensor([[0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 1.0]]))


def test_structured_acts_on_the_channels_left():
    prior = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]])
    # Row 0 is already gone, so the one row to prune is row 1 though it has the larger norm.
    mask = container_of(LnStructured(amount=1, n=2, dim=0)).compute_mask(T, prior)
    assert torch.equal(mask, torch.zeros(2, 4))
    # Columns: column 2 is gone already; of columns 0, 1, 3 the smallest L2 norm is column 0.
    mask = container_of(LnStructured(amount=1, n=2, dim=1)).compute_mask(T, PRIOR)
    assert torch.equal(mask, torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]]))


def test_global_acts_on_the_whole_tensor():
    custom = torch.tensor([[0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    mask = container_of(CustomFromMask(custom)).compute_mask(T, PRIOR)
    assert torch.equal(mask, PRIOR * custom)


def test_the_mask_takes_the_scores_dtype():
    mask = container_of(L1Unstructured(1)).compute_mask(T.double(), PRIOR.int())
    assert mask.dtype == torch.float64


def test_unknown_pruning_type_is_a_value_error():
    class Odd(L1Unstructured):
        PRUNING_TYPE = "diagonal"

    with pytest.raises(ValueError, match="Unrecognized PRUNING_TYPE diagonal"):
        container_of(Odd(1)).compute_mask(T, PRIOR)


def test_structured_method_without_dim_is_an_attribute_error():
    method = RandomStructured(1, 0)
    del method.dim
    with pytest.raises(AttributeError, match="`dim`"):
        container_of(method).compute_mask(T, PRIOR)


def test_structured_dim_below_range_is_an_index_error():
    with pytest.raises(IndexError, match="out of bounds"):
        container_of(LnStructured(1, 2, dim=-3)).compute_mask(T, PRIOR)


@pytest.mark.parametrize(
    "method",
    [L1Unstructured(1), LnStructured(1, 1, dim=-1), CustomFromMask(torch.zeros(2, 4))],
    ids=["unstructured", "structured", "global"],
)
def test_compute_mask_on_meta_keeps_shape_dtype_device(method):
    t = torch.empty(2, 4, device="meta", dtype=torch.float16)
    mask = container_of(method).compute_mask(t, torch.ones(2, 4, device="meta"))
    assert (mask.shape, mask.dtype, mask.device) == (t.shape, t.dtype, t.device)


def test_compute_mask_leaves_the_default_mask_alone():
    # torch writes the new mask into default_mask when its dtype is t's.
    prior = PRIOR.clone()
    mask = container_of(L1Unstructured(amount=2)).compute_mask(T, prior)
    assert torch.equal(prior, PRIOR)
    assert mask.data_ptr() != prior.data_ptr()


class _Recorder(BasePruningMethod):
    """An unstructured method that records what it was shown and returns a fixed mask of its own values."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        self.seen = (t.clone(), default_mask.clone())
        return torch.arange(t.numel(), dtype=t.dtype).reshape(t.shape) + 10


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "channels_last"])
def test_an_unstructured_method_sees_the_entries_still_one_in_order_and_fills_only_them(layout):
    g = torch.Generator().manual_seed(3)
    t = torch.randn(2, 3, 4, 5, generator=g)
    prior = (torch.rand(2, 3, 4, 5, generator=g) > 0.4).float()
    prior[0, 0, 0, :2] = torch.tensor([0.5, 2.0])  # kept as they are: neither is 1
    if layout == "transposed":  # same shapes, other strides (each its own)
        t = t.transpose(1, 3).contiguous().transpose(1, 3)
        prior = prior.transpose(0, 2).contiguous().transpose(0, 2)
    elif layout == "channels_last":
        t, prior = t.to(memory_format=torch.channels_last), prior.to(memory_format=torch.channels_last)
    recorder = _Recorder()
    mask = container_of(recorder).compute_mask(t, prior)
    kept = prior == 1
    assert torch.equal(recorder.seen[0], t[kept]) and torch.equal(recorder.seen[1], prior[kept])
    want = prior.clone()
    want[kept] = torch.arange(int(kept.sum()), dtype=t.dtype) + 10
    assert mask.is_contiguous() and torch.equal(mask, want)
