"""The docs cannot rot: every Python example runs, every link lands, every public name is documented."""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from markdown.extensions.toc import slugify

import prunereg
import prunereg.prune

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

# Put this comment on the line before a ```python block that cannot run in the
# test suite (it needs several processes, a GPU, a file from outside).
SKIP_MARKER = "<!-- skip -->"

_FENCE = re.compile(r"^```(\w*)\s*$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class CodeBlock:
    path: Path
    line: int  # of the block's first code line, 1-based
    code: str


def python_blocks(path: Path, text: str) -> list[CodeBlock]:
    """The ```python blocks of a Markdown page, less those marked with ``SKIP_MARKER``."""
    blocks: list[CodeBlock] = []
    lines = text.splitlines()
    previous = ""  # the last non-blank line outside a block
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            if lines[index].strip():
                previous = lines[index].strip()
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if opening.group(1) == "python" and previous != SKIP_MARKER:
            blocks.append(CodeBlock(path, index + 2, "\n".join(lines[index + 1 : end])))
        previous = ""
        index = end + 1
    return blocks


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _pages_with_examples() -> list[Path]:
    return [page for page in PAGES if python_blocks(page, page.read_text())]


@pytest.mark.parametrize("page", _pages_with_examples(), ids=_page_id)
def test_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page's blocks run in order in one namespace, as a reader would paste them."""
    monkeypatch.chdir(tmp_path)  # examples may save files
    namespace: dict[str, object] = {"__name__": "__docs__"}
    with torch.random.fork_rng():
        for block in python_blocks(page, page.read_text()):
            # Padding with blank lines makes tracebacks point at the page's own lines.
            code = compile("\n" * (block.line - 1) + block.code, str(block.path), "exec")
            exec(code, namespace)


def test_python_blocks_finds_runnable_blocks_only() -> None:
    text = "\n".join(
        [
            "# Page",
            "```python",
            "x = 1",
            "```",
            "<!-- skip -->",
            "",
            "```python",
            "import needs_a_gpu",
            "```",
            "```bash",
            "pip install prunereg",
            "```",
            "```python",
            "y = 2",
            "z = 3",
            "```",
        ]
    )
    blocks = python_blocks(Path("page.md"), text)
    assert [(block.line, block.code) for block in blocks] == [(3, "x = 1"), (14, "y = 2\nz = 3")]


def test_readme_and_quickstart_have_examples() -> None:
    assert ROOT / "README.md" in _pages_with_examples()
    assert DOCS / "quickstart.md" in _pages_with_examples()


def _anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#+\s+(.+?)\s*$", page.read_text(), re.MULTILINE)
    return {slugify(heading.replace("`", ""), "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_relative_links_land(page: Path) -> None:
    """Links to other files of the repository name files and headings that exist.

    mkdocs checks the links between docs pages too, but not the README's, which
    GitHub shows and mkdocs never builds.
    """
    for target in _LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve()
        assert linked.exists(), f"{_page_id(page)} links to missing {target}"
        if anchor:
            assert anchor in _anchors(linked), f"{_page_id(page)} links to missing heading {target}"


def _documented_objects() -> list[object]:
    objects = []
    for identifier in _DIRECTIVE.findall((DOCS / "api.md").read_text()):
        module_name, _, name = identifier.rpartition(".")
        objects.append(getattr(importlib.import_module(module_name), name))
    return objects


@pytest.mark.parametrize(
    ("module", "name"),
    [(prunereg, name) for name in prunereg.__all__]
    + [(prunereg.prune, name) for name in prunereg.prune.__all__],
    ids=lambda value: getattr(value, "__name__", value),
)
def test_api_reference_documents_public_name(module: object, name: str) -> None:
    documented = _documented_objects()
    target = getattr(module, name)
    assert any(target is obj for obj in documented), f"docs/api.md has no '::: ' entry for {module.__name__}.{name}"


def _sphinx_roles_extension():
    spec = importlib.util.spec_from_file_location("sphinx_roles", DOCS / "_ext" / "sphinx_roles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docstrings_render_as_markdown() -> None:
    to_markdown = _sphinx_roles_extension().to_markdown
    docstring = (
        "Raises :class:`UnknownMethodError`; see :meth:`~prunereg.BasePruningMethod.apply`.\n"
        "\n"
        "Like this::\n"
        "\n"
        "    with prunereg.safe_globals(nn.Linear):\n"
        "        x = {'a': 1}\n"
        "\n"
        ">>> prunereg.get('identity')(\n"
        "...     )\n"
        "<Identity>\n"
        "\n"
        "The end.\n"
    )
    assert to_markdown(docstring) == (
        "Raises `UnknownMethodError`; see `prunereg.BasePruningMethod.apply`.\n"
        "\n"
        "Like this:\n"
        "\n"
        "    with prunereg.safe_globals(nn.Linear):\n"
        "        x = {'a': 1}\n"
        "\n"
        "```pycon\n"
        ">>> prunereg.get('identity')(\n"
        "...     )\n"
        "<Identity>\n"
        "```\n"
        "\n"
        "The end.\n"
    )
