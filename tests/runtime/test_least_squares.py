"""Recovery's least-squares statistic on the runtime's protocol: folded by the Recorder, combined like the others."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prunereg._runtime.least_squares import CHUNK, LeastSquares, NormalEquations
from prunereg._runtime.recorder import Called, Recorder
from prunereg._runtime.standard import InputSqNorms
from prunereg._runtime.statistics import Observation


def _folded(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> LeastSquares:
    statistic = LeastSquares()
    for batch, (x, y) in enumerate(pairs):
        statistic.fold(Observation(batch, x, y))
    return statistic


def _expected(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.cat([x.reshape(-1, x.shape[-1]) for x, _ in pairs]).double()
    y = torch.cat([y.reshape(-1, y.shape[-1]) for _, y in pairs]).double()
    x = torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)
    return x.T @ x, x.T @ y, y.square().sum(0)


@settings(max_examples=25, deadline=None)
@given(
    batches=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 7)), min_size=2, max_size=5),
    widths=st.tuples(st.integers(1, 300), st.integers(1, 5)),
    split=st.integers(1, 4),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_two_halves_combined_are_the_whole_and_the_sums_over_every_token(
    batches: list[tuple[int, int]], widths: tuple[int, int], split: int, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    n_in, n_out = widths
    pairs = [(torch.randn(*shape, n_in, dtype=dtype), torch.randn(*shape, n_out, dtype=dtype)) for shape in batches]
    split = min(split, len(pairs) - 1)
    whole, first, second = _folded(pairs), _folded(pairs[:split]), _folded(pairs[split:])
    first.combine(second)
    combined, alone = first.result(), whole.result()
    assert isinstance(combined, NormalEquations) and isinstance(alone, NormalEquations)
    gram, cross, target_sq = _expected(pairs)
    close = 1e-12 if dtype == torch.float64 else 1e-5  # float32 inputs: a batch's products are made in float32
    for equations in (combined, alone):
        assert equations.n_tokens == sum(a * b for a, b in batches) and equations.n_inputs == n_in
        assert equations.gram.dtype == equations.cross.dtype == torch.float64  # and summed in float64
        assert torch.equal(equations.gram, equations.gram.T)  # mirrored from the upper tiles, exactly
        torch.testing.assert_close(equations.gram, gram, rtol=close, atol=close)
        torch.testing.assert_close(equations.cross, cross, rtol=close, atol=close)
        torch.testing.assert_close(equations.target_sq, target_sq, rtol=1e-12, atol=1e-12)
    assert second.result() is not None and second.n_tokens == sum(a * b for a, b in batches[split:])  # unchanged


def test_combining_is_in_a_fixed_order_so_ranks_agree_to_the_bit() -> None:
    torch.manual_seed(1)
    pairs = [(torch.randn(CHUNK + 5, 6), torch.randn(CHUNK + 5, 2)) for _ in range(4)]
    results = []
    for _ in range(2):
        first, second = _folded(pairs[:2]), _folded(pairs[2:])
        first.combine(second)
        results.append(first.result())
    assert results[0] is not None and results[1] is not None
    assert torch.equal(results[0].gram, results[1].gram) and torch.equal(results[0].cross, results[1].cross)


def test_empty_halves_combine_to_nothing_and_into_anything() -> None:
    empty, other = LeastSquares(), _folded([(torch.ones(2, 3), torch.ones(2, 1))])
    assert empty.result() is None
    empty.combine(LeastSquares())
    assert empty.result() is None
    empty.combine(other)
    mine, theirs = empty.result(), other.result()
    assert mine is not None and theirs is not None and torch.equal(mine.gram, theirs.gram)
    assert mine.gram is not theirs.gram  # a copy: the other statistic is left as it was


def test_combine_refuses_another_statistic_in_one_line() -> None:
    with pytest.raises(TypeError, match="LeastSquares combines with another LeastSquares, not InputSqNorms"):
        LeastSquares().combine(InputSqNorms())


def test_recorded_beside_another_statistic_it_fits_a_linear_module_back_to_its_own_weights() -> None:
    torch.manual_seed(2)
    layer = torch.nn.Linear(5, 3).double()
    recorder = Recorder(
        call_statistics={"least_squares": LeastSquares, "input_sq_norms": InputSqNorms}, calls={"layer": Called(layer)}
    )
    inputs = [torch.randn(4, 6, 5, dtype=torch.float64) for _ in range(3)]
    with torch.no_grad(), recorder:
        for index, x in enumerate(inputs):
            with recorder.batch(index, x):
                layer(x)
    results = recorder.called["layer"].results()
    equations = results["least_squares"]
    solution = torch.linalg.solve(equations.gram, equations.cross)
    torch.testing.assert_close(solution[:-1].T, layer.weight.detach(), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(solution[-1], layer.bias.detach(), rtol=1e-9, atol=1e-9)
    assert equations.squared_error(layer.weight.detach(), layer.bias.detach()) == pytest.approx(0, abs=1e-9)
    x = torch.cat(inputs).reshape(-1, 5).float()
    torch.testing.assert_close(results["input_sq_norms"], x.square().sum(0))


def test_an_observation_without_an_output_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="least_squares observes a module called with a tensor that returns one"):
        LeastSquares().fold(Observation(0, torch.ones(2, 2)))


def test_its_state_is_tensors_and_numbers_that_load_without_code_and_combine_as_the_statistic_itself() -> None:
    import io

    from prunereg._runtime.recorder import Partial

    torch.manual_seed(0)
    pairs = [(torch.randn(2, 5, 6), torch.randn(2, 5, 3)) for _ in range(3)]

    def shifted(observation: Observation) -> tuple[torch.Tensor, torch.Tensor]:  # a fit that holds a closure
        assert observation.inputs is not None and observation.outputs is not None
        return observation.inputs, observation.outputs + 1

    factories = {"least_squares": lambda: LeastSquares(shifted)}
    first, second = Partial(factories), Partial(factories)
    for batch, (x, y) in enumerate(pairs):
        (first if batch < 2 else second).fold(Observation(batch, x, y))
    buffer = io.BytesIO()
    torch.save(second.state(), buffer)  # what a rank sends: no fit, nothing to unpickle but tensors
    received = Partial.from_state(factories, torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    alone = Partial(factories)
    alone.fold(Observation(0, *pairs[0]))
    alone.fold(Observation(1, *pairs[1]))
    alone.combine(second)
    first.combine(received)
    ours, theirs = first.results()["least_squares"], alone.results()["least_squares"]
    assert first.n_tokens == alone.n_tokens == 30 and ours.n_tokens == 30
    for name in ("gram", "cross", "target_sq"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name))


def test_a_statistic_without_a_state_is_refused_for_an_exchange_in_one_line() -> None:
    from prunereg._runtime.recorder import Partial

    with pytest.raises(TypeError, match=r"^InputSqNorms has no state"):
        Partial({"input_sq_norms": InputSqNorms}).state()
