"""Griffe extension: render prunereg's reST-flavoured docstrings as Markdown.

The code's docstrings use Sphinx roles (``:class:`PruningContainer```), end a
paragraph with ``::`` before a literal block, and show calls as ``>>>``
doctest lines; mkdocstrings reads docstrings as Markdown, where the first two
would show up verbatim and the last as a quotation. Roles become inline code,
a trailing ``::`` a single colon (the indented block stays a code block), and
doctest lines a fenced ``pycon`` block.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|exc|data|obj):`~?([^`]+)`")
_LITERAL_MARKER = re.compile(r"(?<=\S)::$", re.MULTILINE)
# A doctest runs from its first ">>>" line to the next blank line, output included.
_DOCTEST = re.compile(r"^[ \t]*>>>.*(?:\n[ \t]*\S.*)*$", re.MULTILINE)


def to_markdown(docstring: str) -> str:
    """``docstring`` in Markdown: roles as inline code, ``::`` as ``:``, doctests fenced."""
    docstring = _LITERAL_MARKER.sub(":", _ROLE.sub(r"`\1`", docstring))
    return _DOCTEST.sub(lambda lines: f"```pycon\n{lines.group()}\n```", docstring)


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring with ``to_markdown`` once the object tree is built."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
