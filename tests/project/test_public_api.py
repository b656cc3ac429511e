"""The front module shows its public API and nothing else."""

from __future__ import annotations

import prunereg


def test_dir_shows_the_public_api_only() -> None:
    public = sorted({*prunereg.__all__, "__version__"})
    assert dir(prunereg) == public  # not Any, Callable, TYPE_CHECKING, TypeVar, annotations, importlib
    for name in public:
        getattr(prunereg, name)  # each one resolves (and is then cached in the module's globals)
    assert dir(prunereg) == public
