"""Griffe extension: render prunereg's reST-flavoured docstrings as Markdown.

The code's docstrings use Sphinx roles (``:class:`PruningContainer```) and
end a paragraph with ``::`` before a literal block; mkdocstrings reads
docstrings as Markdown, where both would show up verbatim. Roles become inline
code, a trailing ``::`` a single colon (the indented block stays a code block).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|exc|data|obj):`~?([^`]+)`")
_LITERAL_MARKER = re.compile(r"(?<=\S)::$", re.MULTILINE)


def to_markdown(docstring: str) -> str:
    """``docstring`` with Sphinx roles as inline code and trailing ``::`` as ``:``."""
    return _LITERAL_MARKER.sub(":", _ROLE.sub(r"`\1`", docstring))


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring with ``to_markdown`` once the object tree is built."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
