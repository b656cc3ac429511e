"""The block-by-block runtime recovery runs on, borrowed in one place from the engines below it.

Calibration ids, finding the decoder blocks, capturing their inputs and running
them come from the one-shot engine; the parts of a block (its MLP, attention,
experts, and their writer projections) from shrinking. Recovery imports them
from here only, so that moving the runtime into a package of its own changes
this module alone.
"""

from __future__ import annotations

from prunereg._oneshot.blocks import BlocksNotFoundError, find_blocks
from prunereg._oneshot.calibration import calibration_ids, check_fits_model
from prunereg._oneshot.capture import BlockInputs, advance, batches_of, call_block, capture_first_block_inputs
from prunereg._oneshot.conformance import _default_devices as default_devices
from prunereg._oneshot.engine import _calibration_mode as calibration_mode
from prunereg._oneshot.engine import _check_not_reparametrized as check_not_reparametrized
from prunereg._oneshot.engine import _input_device as input_device
from prunereg._oneshot.precision import matmul_precision
from prunereg._shrink.architecture import Journal, UnitGroup, add_zero_biases, find_experts, find_heads, find_mlp

__all__ = [
    "BlockInputs",
    "BlocksNotFoundError",
    "Journal",
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
    "default_devices",
    "find_blocks",
    "find_experts",
    "find_heads",
    "find_mlp",
    "input_device",
    "matmul_precision",
]
