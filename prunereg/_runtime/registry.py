"""Statistics by name: the built-in ones, and those plugins register.

A method names the statistics it needs in its ``STATISTICS``; each name must be
registered when the method's class is defined (:func:`check_statistics`), so a
plugin registers its own statistic (:func:`register_statistic`, exported as
``prunereg.toolkit.register_statistic``) before the method that asks for it. A
name is taken once: registering another class under it is a ``ValueError``.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable
from typing import TypeVar

from prunereg._runtime.standard import BUILT_IN
from prunereg._runtime.statistics import SITES, Statistic

_S = TypeVar("_S", bound=type[Statistic])

_LOCK = threading.Lock()
_BY_NAME: dict[str, type[Statistic]] = {}


def register_statistic(cls: _S, /) -> _S:
    """Make the statistic ``cls`` known by its ``NAME``, so that methods can ask for it; returns ``cls`` (a decorator).

    ``cls`` subclasses :class:`~prunereg._runtime.statistics.Statistic`, with a
    ``NAME`` (a Python identifier) and a ``SITE`` from ``SITES``; else a
    TypeError. A name another class holds is a ValueError naming both; the same
    class registered again is accepted.
    """
    if not (isinstance(cls, type) and issubclass(cls, Statistic)):
        raise TypeError(f"a statistic subclasses prunereg.toolkit.Statistic, and {cls!r} does not")
    name, site = cls.NAME, cls.SITE
    if not (isinstance(name, str) and name.isidentifier()):
        raise TypeError(f"{cls.__qualname__}.NAME must be a Python identifier, not {name!r}")
    if site not in SITES:
        raise TypeError(f"{cls.__qualname__}.SITE must be one of {', '.join(map(repr, SITES))}, not {site!r}")
    with _LOCK:
        held = _BY_NAME.setdefault(name, cls)
    if held is not cls:
        raise ValueError(
            f"the statistic name {name!r} is taken by {held.__module__}.{held.__qualname__}; "
            f"give {cls.__module__}.{cls.__qualname__} another NAME"
        )
    return cls


def statistic(name: str) -> type[Statistic]:
    """The statistic registered as ``name``; a one-line ValueError naming the known ones if there is none."""
    found = _BY_NAME.get(name)
    if found is None:
        raise ValueError(f"no statistic is registered as {name!r} (known: {', '.join(sorted(_BY_NAME))})")
    return found


def statistic_names() -> frozenset[str]:
    """The names of every registered statistic."""
    return frozenset(_BY_NAME)


def at_site(names: Iterable[str], site: str) -> dict[str, type[Statistic]]:
    """Those of the statistics ``names`` observed at ``site``, by name, in sorted order (one run, one order)."""
    return {name: cls for name in sorted(names) if site == (cls := statistic(name)).SITE}


def check_statistics(owner: str, names: Collection[str], sites: Collection[str] = SITES) -> None:
    """Refuse ``names`` (``owner``'s ``STATISTICS``) unless each is registered and observed at one of ``sites``.

    A one-line TypeError, for a method class being defined.
    """
    unknown = sorted(set(names) - set(_BY_NAME))
    if unknown:
        raise TypeError(
            f"{owner}.STATISTICS names unknown statistics: {', '.join(unknown)} (register a statistic of your own "
            "with prunereg.toolkit.register_statistic before the class that asks for it)"
        )
    misplaced = sorted(name for name in names if _BY_NAME[name].SITE not in sites)
    if misplaced:
        where = " or ".join(sorted(sites))
        raise TypeError(
            f"{owner}.STATISTICS names {', '.join(misplaced)}, observed at "
            f"{', '.join(sorted({_BY_NAME[name].SITE for name in misplaced}))}; this kind of method reads "
            f"statistics of {where}"
        )


for _built_in in BUILT_IN:
    register_statistic(_built_in)
