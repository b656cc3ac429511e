"""benchmarks/llm.py loaded as a module: its SmolLM2 download and preparation, configurations and quality bands."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_benchmark() -> ModuleType:
    folder = Path(__file__).resolve().parents[2] / "benchmarks"
    path = folder / "llm.py"
    if str(folder) not in sys.path:
        sys.path.append(str(folder))  # llm.py imports memory.py from its own folder, as a script would
    spec = importlib.util.spec_from_file_location("llm_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
