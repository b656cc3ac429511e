"""A pruned model under torch.compile and torch.export: one graph, no more recompiles than torch, eager results."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
import torch.nn.utils.prune as torch_prune
from torch import nn
from torch._dynamo.testing import CompileCounter

import prunereg.prune as prune

LIBRARIES = {"prunereg": prune, "torch": torch_prune}


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def pruned_mlp(lib, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    lib.l1_unstructured(model[0], "weight", amount=0.5)
    lib.ln_structured(model[2], "weight", amount=0.25, n=2, dim=0)
    lib.l1_unstructured(model[2], "weight", amount=0.3)  # a container
    lib.random_unstructured(model[4], "bias", amount=1)
    return model


def train_eval_loop(model: nn.Module, steps: int = 6) -> tuple[int, list[torch.Tensor]]:
    """Alternate a training step and a no_grad evaluation; the graphs compiled and the evaluations."""
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    x = torch.randn(5, 8)
    evaluations = []
    for _ in range(steps):
        compiled(x).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            evaluations.append(compiled(x))
    return counter.frame_count, evaluations


@pytest.mark.parametrize("lib", LIBRARIES.values(), ids=LIBRARIES.keys())
def test_fullgraph_compiles_into_one_graph_equal_to_eager(lib):
    model = pruned_mlp(lib)
    counter = CompileCounter()
    x = torch.randn(5, 8)
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count <= 2  # one graph with autograd on, at most one more without


def test_train_eval_loop_compiles_no_more_graphs_than_torch():
    mine, mine_evals = train_eval_loop(pruned_mlp(prune))
    torch._dynamo.reset()
    theirs, their_evals = train_eval_loop(pruned_mlp(torch_prune))
    assert mine <= theirs
    for a, b in zip(mine_evals, their_evals):
        torch.testing.assert_close(a, b)


def test_compiled_training_matches_eager_training():
    compiled_model, eager_model = pruned_mlp(prune), pruned_mlp(prune)
    _, compiled_evals = train_eval_loop(compiled_model)
    optimizer = torch.optim.SGD(eager_model.parameters(), lr=0.1)
    x = (torch.manual_seed(1), torch.randn(5, 8))[1]
    for compiled_eval in compiled_evals:
        eager_model(x).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            torch.testing.assert_close(compiled_eval, eager_model(x))


def test_eager_no_grad_fast_path_still_reuses_the_pruned_tensor_after_compiling():
    model = pruned_mlp(prune)
    x = torch.randn(5, 8)
    torch.compile(model, backend=CompileCounter())(x)
    with torch.no_grad():
        model(x)
        weight = model[0].weight
        model(x)
    assert model[0].weight is weight


# torch.export notes that the hooks assign module attributes; it does so for torch's pruning too.
@pytest.mark.filterwarnings("ignore:The tensor attributes")
@pytest.mark.parametrize("lib", LIBRARIES.values(), ids=LIBRARIES.keys())
def test_export_gives_a_program_equal_to_eager(lib):
    model = pruned_mlp(lib)
    x = torch.randn(5, 8)
    program = torch.export.export(model, (x,))
    torch.testing.assert_close(program.module()(x), model(x))
    other = torch.randn(5, 8)
    torch.testing.assert_close(program.module()(other), model(other))


@pytest.mark.filterwarnings("ignore:The tensor attributes")
def test_export_of_an_attention_pruned_through_its_module():
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2, batch_first=True)
    prune.l1_unstructured(attention, "out_proj.weight", amount=0.5)
    prune.l1_unstructured(attention, "in_proj_weight", amount=0.5)
    x = torch.randn(2, 3, 8)
    program = torch.export.export(attention, (x, x, x))
    torch.testing.assert_close(program.module()(x, x, x)[0], attention(x, x, x)[0])
