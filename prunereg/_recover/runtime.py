"""The block-by-block runtime recovery runs on: the public names of :mod:`prunereg._runtime` it uses, in one place.

Calibration ids, finding the decoder blocks and their parts (MLP, attention,
experts, their writer projections), capturing the blocks' inputs and running
them, the run's mode and precision, the recorder and the least-squares
statistic that the refits solve, the ranks that split the calibration, and
where the blocks' weights are (in memory, or gathered from FSDP2's shards):
the same runtime one-shot pruning and shrinking run on.
"""

from __future__ import annotations

from prunereg._distributed.gathered import plain_class
from prunereg._runtime.blocks import BlocksNotFoundError, find_blocks
from prunereg._runtime.calibration import calibration_ids, check_fits_model
from prunereg._runtime.capture import BlockInputs, advance, batches_of, call_block, capture_first_block_inputs
from prunereg._runtime.conformance import default_devices, method_class
from prunereg._runtime.journal import Journal
from prunereg._runtime.least_squares import LeastSquares, NormalEquations
from prunereg._runtime.mode import calibration_mode, check_not_reparametrized, input_device
from prunereg._runtime.parts import UnitGroup, add_zero_biases, find_experts, find_heads, find_mlp
from prunereg._runtime.precision import matmul_precision
from prunereg._runtime.ranks import Ranks, digest, fingerprint, model_digest, own_batches, together
from prunereg._runtime.recorder import Called, Recorder, gather
from prunereg._runtime.sharded import check_sharded_run, is_sharded, sharded_run
from prunereg._runtime.statistics import Observation
from prunereg._runtime.weights import BlockWeights, InMemory

__all__ = [
    "BlockInputs",
    "BlockWeights",
    "BlocksNotFoundError",
    "Called",
    "InMemory",
    "Journal",
    "LeastSquares",
    "NormalEquations",
    "Observation",
    "Ranks",
    "Recorder",
    "UnitGroup",
    "add_zero_biases",
    "advance",
    "batches_of",
    "calibration_ids",
    "calibration_mode",
    "call_block",
    "capture_first_block_inputs",
    "check_fits_model",
    "check_not_reparametrized",
    "check_sharded_run",
    "default_devices",
    "digest",
    "find_blocks",
    "find_experts",
    "find_heads",
    "find_mlp",
    "fingerprint",
    "gather",
    "input_device",
    "is_sharded",
    "matmul_precision",
    "method_class",
    "model_digest",
    "own_batches",
    "plain_class",
    "sharded_run",
    "together",
]
