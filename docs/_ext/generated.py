"""Tables in the docs that are rendered from the registry and the code, so that they cannot go stale.

    python docs/_ext/generated.py           # rewrite every generated table in place
    python docs/_ext/generated.py --check   # list the stale ones and exit 1 (the docs tests check the same)

A page holds a generated table between ``<!-- generated: NAME -->`` and
``<!-- /generated -->`` lines; NAME is one of :data:`RENDERERS`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1]
BUILTIN_DISTRIBUTION = "prunereg"
_BLOCK = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- /generated -->)", re.DOTALL)


def methods_table() -> str:
    """prunereg's own methods (not those of other installed plugins): name, kind, what each prunes."""
    import prunereg

    rows = ["| name | kind | prunes |", "| --- | --- | --- |"]
    for name in prunereg.list_methods():
        info = prunereg.info(name)
        if info.package == BUILTIN_DISTRIBUTION:
            rows.append(f"| `{name}` | [{info.kind}](plugins.md#kinds) | {_cell(info.summary)} |")
    return "\n".join(rows) + "\n"


def kinds_table() -> str:
    """Every kind a method can register as: the class it subclasses and how users run it."""
    from prunereg._plugins.kinds import kinds

    rows = ["| kind | the class subclasses | run with |", "| --- | --- | --- |"]
    rows += [f"| `{kind.name}` | `prunereg.{kind.contract_class}` | {kind.runs_with} |" for kind in kinds()]
    return "\n".join(rows) + "\n"


def oneshot_options_table() -> str:
    """The settings of ``prunereg.oneshot`` and ``prunereg oneshot``, from the one object that defines them."""
    from prunereg._oneshot.settings import OneShotOptions
    from prunereg._runtime.options import options_table

    return options_table(OneShotOptions)


def shrink_options_table() -> str:
    """The settings of ``prunereg.shrink`` and ``prunereg shrink``, from the one object that defines them."""
    from prunereg._runtime.options import options_table
    from prunereg._shrink.options import ShrinkOptions

    return options_table(ShrinkOptions)


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell: a ``|`` in it would end the cell."""
    return text.replace("|", "\\|")


RENDERERS: dict[str, Callable[[], str]] = {
    "methods": methods_table,
    "kinds": kinds_table,
    "oneshot-options": oneshot_options_table,
    "shrink-options": shrink_options_table,
}


def regenerated(text: str) -> str:
    """``text`` with every generated block rendered anew; ``KeyError`` for a block of an unknown name."""
    return _BLOCK.sub(lambda match: match[1] + RENDERERS[match[2]]() + match[4], text)


def generated_blocks(text: str) -> list[str]:
    """The names of the generated blocks on a page, in order."""
    return [match[2] for match in _BLOCK.finditer(text)]


def stale_pages(pages: list[Path]) -> list[Path]:
    """The pages whose generated blocks differ from what the registry renders now."""
    return [page for page in pages if regenerated(page.read_text()) != page.read_text()]


def main(argv: list[str]) -> int:
    pages = sorted(DOCS.glob("*.md"))
    stale = stale_pages(pages)
    if "--check" in argv:
        for page in stale:
            print(f"{page}: a generated table is stale; run python docs/_ext/generated.py", file=sys.stderr)
        return 1 if stale else 0
    for page in stale:
        page.write_text(regenerated(page.read_text()))
        print(f"rewrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
