"""GradualPruning of DTensor and FSDP2 parameters over gloo on CPU: the masks of the full model, at every step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.support.gradual_ranks import CASES

RANKS = Path(__file__).resolve().parents[1] / "support" / "gradual_ranks.py"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not dist.is_gloo_available(), reason="needs the gloo backend")]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, dict[str, object]]]:
    out = tmp_path_factory.mktemp("ranks") / "results"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(RANKS), str(out), "2"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]


@pytest.mark.parametrize("case", list(CASES))
def test_sharded_parameters_get_the_masks_of_the_full_model(results, case):
    for rank in results:
        assert rank[case]["ok"], rank[case].get("error")
