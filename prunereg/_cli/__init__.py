"""The ``prunereg`` command line. Commands import torch only when they run.

:func:`main` is the group of :mod:`prunereg._cli.app`; importing the command
modules here attaches their commands to it.
"""

from __future__ import annotations

from prunereg._cli import checkpoint as _checkpoint  # noqa: F401  (importing it attaches its commands)
from prunereg._cli import oneshot as _oneshot  # noqa: F401  (importing it attaches its commands)
from prunereg._cli import registry as _registry  # noqa: F401  (importing it attaches its commands)
from prunereg._cli import slim as _slim  # noqa: F401  (importing it attaches its commands)
from prunereg._cli.app import main

__all__ = ["main"]
