"""The hook a prunereg plugin implements: the reference for plugin authors.

A plugin is a module named by an entry point in the ``prunereg`` group, in a
distribution named ``prunereg-<x>`` whose module is ``prunereg_<x>``::

    # pyproject.toml
    [project.entry-points.prunereg]
    foo = "prunereg_foo"

    # prunereg_foo/__init__.py  (keep it light: no torch import here)
    import prunereg

    @prunereg.hookimpl
    def prunereg_register_methods(register: prunereg.Register) -> None:
        register("foo", "prunereg_foo.method:FooPruning",
                 kind="unstructured", summary="One line that says what it prunes")

    # prunereg_foo/method.py  (imported on the first prunereg.get("foo"))
    import torch
    import prunereg

    class FooPruning(prunereg.BasePruningMethod):
        PRUNING_TYPE = "unstructured"

        def compute_mask(self, t, default_mask): ...

The class named by the target is imported the first time somebody asks for
the method, so listing methods imports neither torch nor the plugin's
implementation. A calibrated method (run by :func:`prunereg.oneshot`)
subclasses :class:`prunereg.CalibratedMethod` instead and registers with
``kind="calibrated"``. Check a class with
:func:`prunereg.testing.check_pruning_method` (calibrated:
:func:`prunereg.testing.check_calibrated_method`; shrink, a
:class:`prunereg.ShrinkMethod` of ``kind="shrink"``:
:func:`prunereg.testing.check_shrink_method`).
docs/plugins.md is the full guide.
"""

from __future__ import annotations

from typing import Protocol

import pluggy

PROJECT_NAME = "prunereg"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class Register(Protocol):
    """The ``register`` callable a plugin's hook receives: see :func:`prunereg_register_methods`."""

    def __call__(
        self,
        name: str,
        target: object,
        *,
        kind: str,
        summary: str,
        replace: bool = False,
    ) -> None: ...


@hookspec
def prunereg_register_methods(register: Register) -> None:
    """Register this plugin's pruning methods by calling ``register`` once per method.

    ``register(name, target, *, kind, summary, replace=False)``:

    - ``name``: how users ask for the method (``prunereg.get(name)``): an ASCII
      letter, then ASCII letters, digits, ``_`` or ``-``, at most 100
      characters (lowercase with underscores by convention). It is also
      reachable as ``"<plugin>:<name>"``, ``<plugin>`` being the entry-point name.
    - ``target``: a ``"module:Attr"`` string imported on the first ``get()``
      (best: listing stays fast), or the class itself. The class subclasses
      :class:`prunereg.BasePruningMethod`.
    - ``kind``: the class's ``PRUNING_TYPE``, one of the kinds of
      :mod:`prunereg._plugins.kinds`: ``"unstructured"``, ``"structured"`` and
      ``"global"`` (:class:`prunereg.BasePruningMethod` subclasses, run by
      ``apply``), ``"calibrated"`` (:class:`prunereg.CalibratedMethod`
      subclasses, run by :func:`prunereg.oneshot`), ``"shrink"``
      (:class:`prunereg.ShrinkMethod` subclasses, run by :func:`prunereg.shrink`),
      ``"recovery"`` (:class:`prunereg.RecoveryMethod` subclasses, run by
      :func:`prunereg.recover`), ``"importance"`` (:class:`prunereg.Importance` subclasses, used by
      :func:`prunereg.slim`). Checked when the class is imported; ``prunereg
      list`` shows each method's kind.
    - ``summary``: one line saying what the method prunes.
    - ``replace``: take over a name registered earlier (a built-in, say) on
      purpose. Without it the earlier registration keeps the name and this one
      is reported as a conflict; only one plugin may take a name over.

    Plugins load in a fixed order: the built-ins first, then the other
    distributions by name. If this hook raises (``SystemExit`` and
    ``KeyboardInterrupt`` included), every method it registered is withdrawn and
    the plugin is reported as failed; other plugins are not affected. What it
    prints goes to stderr.
    """
