"""How pytest-xdist hands out the suite: a module to a worker, the long tests first, each alone (conftest.py)."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import LONG_TESTS

ROOT = Path(__file__).resolve().parents[2]

SUITE = {
    "conftest.py": (
        "import pytest\n"
        "from tests.support.xdist_scheduler import LongTestsFirst\n\n"
        "@pytest.hookimpl(optionalhook=True)\n"
        "def pytest_xdist_make_scheduler(config, log):\n"
        "    return LongTestsFirst(config, log, ['test_long.py::test_long'])\n"
    ),
    "test_long.py": "import pytest\n\n@pytest.mark.parametrize('name', 'ab')\ndef test_long(name):\n    pass\n",
    "test_many.py": "import pytest\n\n@pytest.mark.parametrize('i', range(6))\ndef test_many(i):\n    pass\n",
    "test_some.py": "import pytest\n\n@pytest.mark.parametrize('i', range(4))\ndef test_some(i):\n    pass\n",
}


def test_every_long_test_is_a_test_of_the_suite() -> None:
    for name in LONG_TESTS:
        path, _, function = name.partition("::")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert callable(getattr(module, function, None)), f"LONG_TESTS names {name}, which is not a test"


@pytest.mark.slow
def test_the_long_tests_start_first_each_on_a_worker_and_a_module_stays_on_one_worker(tmp_path: Path) -> None:
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadscope", "-v"]
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*command, "-o", "addopts=", str(tmp_path)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"^\[(gw\d)\] .*PASSED (\S+)", done.stdout, re.MULTILINE)
    assert len(ran) == 12, done.stdout
    by_worker: dict[str, list[str]] = {}
    for worker, test in ran:
        by_worker.setdefault(worker, []).append(test)
    assert sorted(tests[0] for tests in by_worker.values()) == [
        "test_long.py::test_long[a]",
        "test_long.py::test_long[b]",
    ]
    for module in ("test_many.py", "test_some.py"):
        assert len({worker for worker, test in ran if test.startswith(module)}) == 1, done.stdout
