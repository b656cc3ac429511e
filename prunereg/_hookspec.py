"""The hook a prunereg plugin implements: the reference for plugin authors.

A plugin is a module named by an entry point in the ``prunereg`` group::

    # pyproject.toml
    [project.entry-points.prunereg]
    foo = "prunereg_foo"

    # prunereg_foo/__init__.py  (keep it light: no torch import here)
    import prunereg

    @prunereg.hookimpl
    def prunereg_register_methods(register):
        register("foo", "prunereg_foo.method:FooPruning",
                 kind="unstructured", summary="One line that says what it prunes")

The class named by the target is imported the first time somebody asks for the
method, so listing methods never imports torch or the plugin's implementation.
"""

from __future__ import annotations

from typing import Protocol

import pluggy

PROJECT_NAME = "prunereg"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class Register(Protocol):
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

    - ``name``: how users ask for the method (``prunereg.get(name)``); lowercase
      with underscores, unique across plugins.
    - ``target``: the class, or better a ``"module:Attr"`` string imported on the
      first ``get()``. The class subclasses :class:`prunereg.BasePruningMethod`.
    - ``kind``: the class's ``PRUNING_TYPE``: ``"unstructured"``, ``"structured"``
      or ``"global"``.
    - ``summary``: one line saying what the method prunes.
    - ``replace``: take over a name registered earlier (a built-in, say) on
      purpose; without it the earlier registration wins and the clash is reported.
    """
