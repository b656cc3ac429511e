"""An importance plugin that fails never breaks the CLI or another plugin, as a method plugin cannot (issue 31)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.plugin_fakes import fake_install, site_env

HOOK = "import prunereg\n\n@prunereg.hookimpl\ndef prunereg_register_methods(register):\n"
RANKS = '''
import sys
import torch
import prunereg


class Good(prunereg.Importance):
    """Scores every unit by its index."""

    def __call__(self, group, values):
        return torch.arange(group.size, dtype=torch.float64)


class Raises(prunereg.Importance):
    def __call__(self, group, values):
        raise RuntimeError("this importance is broken")


class Exits(prunereg.Importance):
    def __call__(self, group, values):
        sys.exit(0)
'''
SCRIPT = """
import torch, prunereg
from torch import nn

def attempt(name):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    try:
        report = prunereg.slim(model, torch.randn(2, 3), ratio=0.5, importance=name)
        print(name, "removed", report.removed)
    except Exception as error:
        print(name, type(error).__name__, str(error).splitlines()[0])

for name in ["good", "raises", "gone", "exits", "good", "magnitude"]:
    attempt(name)
"""


@pytest.mark.slow
def test_a_failing_importance_plugin_fails_alone(tmp_path: Path) -> None:
    fake_install(tmp_path, "prunereg_fake_ranks", HOOK + "".join(
        f"    register({name!r}, {target!r}, kind='importance', summary='A fake importance')\n"
        for name, target in [("good", "fake_ranks:Good"), ("raises", "fake_ranks:Raises"),
                             ("exits", "fake_ranks:Exits"), ("gone", "fake_ranks_gone:Gone")]
    ))  # fmt: skip
    (tmp_path / "fake_ranks.py").write_text(RANKS)
    (tmp_path / "fake_ranks_gone.py").write_text("raise ImportError('this module cannot be imported')\n")
    env = {**os.environ, **site_env(tmp_path), "PRUNEREG_STRICT_PLUGINS": "0"}
    ran = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == lines[4] == "good removed 2" and lines[5] == "magnitude removed 2"
    assert lines[1] == "raises RuntimeError this importance is broken"
    assert lines[2].startswith("gone UnknownMethodError") and "cannot be imported" in lines[2]
    assert lines[3].startswith("exits PluginCodeError") and "sys.exit(0)" in lines[3]
    listed = subprocess.run(
        [str(Path(sys.executable).with_name("prunereg")), "list", "--json", "--kind", "importance"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert listed.returncode == 0 and {"good", "raises", "gone"} <= {row["name"] for row in json.loads(listed.stdout)}
