"""The one recorder: input groups found by tensor identity, one hook per group, forwards stopped when nothing follows.

It serves every engine: a whole model's forward (gradual pruning), a block's
layer inputs (one-shot pruning), and a block's writer inputs, hidden states
and module calls (shrinking); the shrink side of it is in ``tests/shrink/test_gather.py``.
"""

from __future__ import annotations

import pytest
import torch

from prunereg._runtime.capture import BlockInputs
from prunereg._runtime.recorder import Called, Recorder, gather
from prunereg._runtime.standard import Hessian, InputSqNorms
from prunereg.toolkit import Observation, Statistic
from tests.support.statistics import CallsItsLayerTwice

SQ_NORMS = {"input_sq_norms": InputSqNorms}


class _TwoBranches(torch.nn.Module):
    """a and b read the same tensor; c reads another; d is never called."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (torch.nn.Linear(4, 4) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.a(x) + self.b(x)))


def test_layers_reading_one_tensor_form_one_group_with_one_hook_after_the_first_batch():
    torch.manual_seed(0)
    model = _TwoBranches()
    layers = {name: layer for name, layer in model.named_children() if name != "d"}
    inputs = [torch.randn(2, 5, 4) for _ in range(3)]
    calls_of_c = []
    model.c.register_forward_hook(lambda *_: calls_of_c.append(1))
    with Recorder(SQ_NORMS, layers=layers) as recorder:
        for x in inputs:
            with recorder.batch():
                model(x)
        assert sum(len(layer._forward_pre_hooks) for layer in layers.values()) == 2
    # Once the groups are known, the forward stops before the last group's layer runs.
    assert len(calls_of_c) == 1
    assert all(not layer._forward_pre_hooks for layer in layers.values())
    groups = recorder.group_results()
    assert [names for names, _, _ in groups] == [["a", "b"], ["c"]]
    tokens = torch.cat(inputs).reshape(-1, 4)
    assert groups[0][1] == 30
    assert torch.allclose(groups[0][2]["input_sq_norms"], (tokens**2).sum(0), rtol=1e-5)
    hidden = torch.relu(model.a(tokens) + model.b(tokens))
    assert torch.allclose(groups[1][2]["input_sq_norms"], (hidden**2).sum(0), rtol=1e-5)


class _Routed(torch.nn.Module):
    """``late`` runs only on inputs whose sum is positive (an expert no token of the first batch chose)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.late, self.last = (torch.nn.Linear(4, 4) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        if bool(x.sum() > 0):
            h = h + self.late(x + 1)
        return self.last(h)


def test_a_layer_first_reached_after_the_first_batch_keeps_its_hook_and_gets_its_statistics():
    model = _Routed()
    inputs = [-torch.ones(1, 3, 4), torch.ones(1, 2, 4), -torch.ones(1, 3, 4), torch.ones(1, 2, 4)]
    calls_of_last = []
    model.last.register_forward_hook(lambda *_: calls_of_last.append(1))
    with Recorder(SQ_NORMS, layers=dict(model.named_children())) as recorder:
        for index, x in enumerate(inputs):
            with recorder.batch(index):
                model(x)
    groups = {names[0]: (n_tokens, results) for names, n_tokens, results in recorder.group_results()}
    assert groups["late"][0] == 4  # the two positive batches' tokens
    assert torch.equal(groups["late"][1]["input_sq_norms"], torch.full((4,), 4.0 * 4))
    assert groups["first"][0] == groups["last"][0] == 10
    # a forward stops once every group is folded in: not the first, nor the third, where ``late`` is not called
    assert len(calls_of_last) == 2


def test_only_the_statistics_asked_for_are_gathered():
    layer = torch.nn.Linear(3, 3)
    with Recorder(SQ_NORMS, layers={"layer": layer}) as recorder, recorder.batch():
        layer(torch.ones(2, 3))
    [(_, n_tokens, results)] = recorder.group_results()
    assert n_tokens == 2 and list(results) == ["input_sq_norms"] and results["input_sq_norms"].tolist() == [2.0] * 3


def test_a_layer_called_twice_is_one_group_fed_by_both_calls_on_every_batch_and_no_forward_stops():
    torch.manual_seed(0)
    model = CallsItsLayerTwice()
    inputs = [torch.randn(2, 3, 4) for _ in range(3)]
    out_calls = []
    model.out.register_forward_hook(lambda *_: out_calls.append(1))
    with torch.no_grad(), Recorder(SQ_NORMS, layers={"shared": model.shared, "out": model.out}) as recorder:
        for x in inputs:
            with recorder.batch():
                model(x)
    groups = recorder.group_results()
    assert [names for names, _, _ in groups] == [["shared"], ["out"]]  # not the shared layer twice
    assert len(out_calls) == 3 and groups[0][1] == 2 * 18
    with torch.no_grad():
        firsts = torch.cat(inputs).reshape(-1, 4)
        seconds = model.shared(firsts)
    expected = (firsts.double() ** 2).sum(0) + (seconds.double() ** 2).sum(0)
    torch.testing.assert_close(groups[0][2]["input_sq_norms"].double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        ("tiny_llama", [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["self_attn.o_proj"],
                        ["mlp.gate_proj", "mlp.up_proj"], ["mlp.down_proj"]]),
        ("tiny_gpt2", [["attn.c_attn"], ["attn.c_proj"], ["mlp.c_fc"], ["mlp.c_proj"]]),
        ("tiny_opt", [["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["self_attn.out_proj"],
                      ["fc1"], ["fc2"]]),
    ],
)  # fmt: skip
def test_input_groups_of_real_decoder_blocks(build, expected):
    pytest.importorskip("transformers")
    from prunereg._runtime.blocks import find_blocks, prunable_layers
    from tests.support import tiny_lm as _tiny_lm

    model = getattr(_tiny_lm, build)()
    _, blocks = find_blocks(model)
    seen = {}

    def spy(module, args):
        seen.setdefault(module, []).append(args[0])

    handles = [layer.register_forward_pre_hook(spy) for layer in prunable_layers(blocks[0]).values()]
    layers = prunable_layers(blocks[0])
    with torch.no_grad(), Recorder(SQ_NORMS, layers=layers) as recorder, recorder.batch():
        model(_tiny_lm.calibration_ids(2, 8))
    for handle in handles:
        handle.remove()
    groups = recorder.group_results()
    assert [names for names, _, _ in groups] == expected
    for names, n_tokens, results in groups:
        x = seen[layers[names[0]]][0].reshape(-1, seen[layers[names[0]]][0].shape[-1])
        assert n_tokens == 16
        assert torch.allclose(results["input_sq_norms"], (x.float() ** 2).sum(0), rtol=1e-5)


class _Seen(Statistic):
    """Keeps what it is shown (not registered: the recorder takes any factory)."""

    NAME = "seen"
    SITE = "module_call"

    def __init__(self) -> None:
        self.observations: list[Observation] = []

    def fold(self, observation: Observation) -> None:
        self.observations.append(observation)

    def combine(self, other: Statistic) -> None:
        assert isinstance(other, _Seen)
        self.observations += other.observations

    def result(self) -> list[Observation]:
        return self.observations


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner, self.out = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, hidden: torch.Tensor, *, scale: float) -> torch.Tensor:
        return hidden + self.out(torch.relu(self.inner(hidden) * scale))


def test_a_module_call_is_folded_after_the_blocks_forward_with_its_arguments_output_and_the_blocks_hidden_states():
    torch.manual_seed(0)
    block = _Block()
    hidden = [torch.randn(2, 3, 4) for _ in range(2)]
    inputs = BlockInputs(hidden, [()] * 2, [{"scale": 2.0}] * 2)
    recorder = Recorder(call_statistics={"seen": _Seen}, calls={"inner": Called(block.inner, units=7)})
    with torch.no_grad():
        outputs = gather(block, inputs, recorder, keep_outputs=True)
    observations = recorder.called["inner"].results()["seen"]
    assert [o.batch for o in observations] == [0, 1] and recorder.called["inner"].n_tokens == 12
    for observation, x, y in zip(observations, hidden, outputs, strict=True):
        assert observation.module is block.inner and observation.units == 7
        assert observation.args[0] is x and observation.inputs is x
        torch.testing.assert_close(observation.outputs, block.inner(x))
        assert observation.block_inputs is x and observation.block_outputs is y


class _Counted(Statistic):
    NAME = "counted"
    SITE = "block"

    def __init__(self) -> None:
        self.count = 0

    def fold(self, observation: Observation) -> None:
        self.count += 1

    def combine(self, other: Statistic) -> None:
        assert isinstance(other, _Counted)
        self.count += other.count

    def result(self) -> int:
        return self.count


def test_a_pass_with_block_statistics_keeps_every_forward_whole():
    torch.manual_seed(0)
    block = _Block()
    inputs = BlockInputs([torch.randn(2, 3, 4) for _ in range(3)], [()] * 3, [{"scale": 1.0}] * 3)
    out_calls = []
    block.out.register_forward_hook(lambda *_: out_calls.append(1))
    recorder = Recorder(SQ_NORMS, layers={"out": block.out}, block_statistics={"count": _Counted})
    with torch.no_grad():
        gather(block, inputs, recorder)
    assert len(out_calls) == 3 and recorder.block.results() == {"count": 3} and recorder.block.n_tokens == 18


def test_every_fold_runs_at_full_float32_matmul_precision():
    precisions = []

    class Precision(_Counted):
        def fold(self, observation: Observation) -> None:
            precisions.append(torch.backends.mkldnn.matmul.fp32_precision)

    block = _Block()
    inputs = BlockInputs([torch.randn(1, 2, 4)], [()], [{"scale": 1.0}])
    before = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"  # what matmul_precision="medium" sets on CPUs
    try:
        with torch.no_grad():
            gather(block, inputs, Recorder(block_statistics={"precision": Precision}))
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = before
    assert precisions == ["ieee"]


def test_a_layer_statistic_gathers_the_hessian_of_every_group():
    torch.manual_seed(0)
    model = _TwoBranches()
    x = torch.randn(2, 5, 4)
    recorder = Recorder({"hessian": Hessian}, layers=dict(model.named_children()))
    with torch.no_grad(), recorder, recorder.batch():
        model(x)
    tokens = x.reshape(-1, 4).double()
    [(names, n_tokens, results), _] = recorder.group_results()
    assert names == ["a", "b"] and n_tokens == 10
    torch.testing.assert_close(results["hessian"].double(), 2 / 10 * tokens.T @ tokens, rtol=1e-5, atol=1e-5)


class _NormalEquations(Statistic):
    """What a recovery refit of a writer projection solves: ``[X 1]^T [X 1]`` and ``[X 1]^T R`` in float64.

    ``X`` is the writer's input, ``R`` what it must add for the block's output
    to be the target: the target less the rest of the block's output. Made for
    one run, with that run's targets (the recorder takes any factory).
    """

    NAME = "normal_equations"
    SITE = "module_call"

    def __init__(self, targets: list[torch.Tensor]) -> None:
        self.targets = targets
        self.gram: torch.Tensor | None = None
        self.cross: torch.Tensor | None = None

    def fold(self, observation: Observation) -> None:
        assert observation.inputs is not None and observation.outputs is not None
        assert observation.block_outputs is not None
        rest = observation.block_outputs - observation.outputs
        wanted = (self.targets[observation.batch] - rest).reshape(-1, rest.shape[-1]).double()
        x = observation.inputs.reshape(-1, observation.inputs.shape[-1]).double()
        x = torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)
        gram, cross = x.T @ x, x.T @ wanted
        self.gram = gram if self.gram is None else self.gram + gram
        self.cross = cross if self.cross is None else self.cross + cross

    def combine(self, other: Statistic) -> None:
        assert isinstance(other, _NormalEquations)
        if other.gram is not None and other.cross is not None:
            self.gram = other.gram if self.gram is None else self.gram + other.gram
            self.cross = other.cross if self.cross is None else self.cross + other.cross

    def result(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.gram, self.cross


def test_a_run_specific_statistic_gathers_a_writers_normal_equations_against_the_runs_targets():
    pytest.importorskip("transformers")
    from functools import partial

    from prunereg._runtime.capture import capture_first_block_inputs
    from tests.support.tiny_lm import calibration_ids, tiny_llama

    model = tiny_llama(layers=2)
    block, writer = model.model.layers[0], model.model.layers[0].mlp.down_proj
    with torch.no_grad():
        inputs = capture_first_block_inputs(model, block, list(calibration_ids(6, 8).split(2)))
        targets = [model.model.layers[1](hidden, *args, **kwargs) for hidden, args, kwargs in
                   zip(inputs.hidden, inputs.args, inputs.kwargs, strict=True)]  # fmt: skip
        recorder = Recorder(
            call_statistics={"normal_equations": partial(_NormalEquations, targets)},
            calls={"down_proj": Called(writer)},
        )
        gather(block, inputs, recorder)
        seen: list[tuple[torch.Tensor, torch.Tensor]] = []
        handle = writer.register_forward_hook(lambda _, args, output: seen.append((args[0], output)))
        outputs = [block(hidden, *args, **kwargs) for hidden, args, kwargs in
                   zip(inputs.hidden, inputs.args, inputs.kwargs, strict=True)]  # fmt: skip
        handle.remove()
    x = torch.cat([x.reshape(-1, x.shape[-1]) for x, _ in seen]).double()
    x = torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)
    wanted = torch.cat([
        (target - (output - written)).reshape(-1, target.shape[-1])
        for target, output, (_, written) in zip(targets, outputs, seen, strict=True)
    ]).double()  # fmt: skip
    gram, cross = recorder.called["down_proj"].results()["normal_equations"]
    torch.testing.assert_close(gram, x.T @ x, rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(cross, x.T @ wanted, rtol=1e-10, atol=1e-8)
