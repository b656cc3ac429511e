"""pytest-xdist's ``loadscope`` as this suite runs it: a module to a worker, and the long tests first, each alone.

Under ``loadscope`` a module (or class) is one unit of work, given to one
worker, so that a module's shared fixture (a 2-rank launch, a saved model
folder) is built once; units with more tests are handed out first. A test named
in the long list is the exception: each of its parametrizations is a unit of
its own, and these units are handed out before every module, so that the short
modules fill the workers' last minutes instead of one long test running alone
at the end. (xdist's ``xdist_group`` mark cannot say this: ``loadgroup`` spreads
the unmarked tests one by one, and the group it appends to a node id is lost
under pytest 9.)
"""

from __future__ import annotations

from collections.abc import Collection

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController


class LongTestsFirst(LoadScopeScheduling):
    """``loadscope``, but each parametrization of a ``long_tests`` test (``path::name``) is a unit handed out first."""

    def __init__(self, config: pytest.Config, log: Producer | None, long_tests: Collection[str]) -> None:
        super().__init__(config, log)
        self.long_tests = frozenset(long_tests)

    def is_long(self, nodeid: str) -> bool:
        return nodeid.partition("[")[0] in self.long_tests

    def _split_scope(self, nodeid: str) -> str:
        return nodeid if self.is_long(nodeid) else super()._split_scope(nodeid)

    def _assign_work_unit(self, node: WorkerController) -> None:
        for scope in reversed([scope for scope in self.workqueue if self.is_long(scope)]):
            self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)
