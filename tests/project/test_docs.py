"""The docs cannot rot: every example runs and shows what it prints, every link lands, every public name is documented.

A page's ```python and ```console blocks run in order, in one working
directory, as a reader would paste them: Python blocks in one namespace,
console blocks command by command, their output compared with the page. An
```output block right after a Python block is what that block prints.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from markdown.extensions.toc import slugify

import prunereg
import prunereg.prune
from prunereg._cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

# Put this comment on the line before a block that cannot run in the test
# suite (it needs several processes, a GPU, a package from outside).
SKIP_MARKER = "<!-- skip -->"
# `<!-- file: NAME -->` before a ```python block: the block is a script the
# page runs later (`$ python NAME`), written to NAME instead of executed.
_FILE_MARKER = re.compile(r"^<!-- file: ([\w.-]+) -->$")

_FENCE = re.compile(r"^```(\w*)\s*$")
_RUN = ("python", "console", "output")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.MULTILINE)
# Other installed plugins may add method names to "did you mean" messages.
_KNOWN_METHODS = re.compile(r"\(known: [^)]*\)")


@dataclass(frozen=True)
class CodeBlock:
    path: Path
    line: int  # of the block's first code line, 1-based
    language: str  # "python", "console" or "output" (what the Python block before it prints)
    code: str
    file: str | None = None  # a script to write, not to run


def code_blocks(path: Path, text: str) -> list[CodeBlock]:
    """The ```python, ```console and ```output blocks of a Markdown page, less those marked with ``SKIP_MARKER``."""
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
        language = opening.group(1)
        if language in _RUN and previous != SKIP_MARKER:
            file = _FILE_MARKER.match(previous)
            code = "\n".join(lines[index + 1 : end])
            blocks.append(CodeBlock(path, index + 2, language, code, file.group(1) if file else None))
        previous = ""
        index = end + 1
    return blocks


def console_commands(block: CodeBlock) -> list[tuple[int, str, str]]:
    """``(line, command, expected output)`` for each ``$ `` line of a console block."""
    found: list[tuple[int, str, str]] = []
    for offset, line in enumerate((block.code + "\n").splitlines(keepends=True)):
        if line.startswith("$ "):
            found.append((block.line + offset, line[2:].strip(), ""))
        elif found:
            found[-1] = (found[-1][0], found[-1][1], found[-1][2] + line)
        else:
            pytest.fail(f"{block.path}:{block.line + offset}: console output before any command")
    return found


def _page_id(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _pages_with_examples() -> list[Path]:
    return [page for page in PAGES if code_blocks(page, page.read_text())]


class Reader:
    """Runs a page's blocks in order, as a reader at a shell and a Python prompt would."""

    def __init__(self) -> None:
        self.namespace: dict[str, object] = {"__name__": "__docs__"}
        self.exit_code: int | None = None
        self.printed: str | None = None  # by the last Python block

    def run(self, block: CodeBlock) -> None:
        where = f"{_page_id(block.path)}:{block.line}"
        if block.language == "python":
            self.printed = None
            if block.file is not None:
                Path(block.file).write_text(block.code + "\n")
                return
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(self._compiled(block.code, block.path, block.line), self.namespace)
            self.printed = printed.getvalue()
            return
        if block.language == "output":
            assert self.printed is not None, f"{where}: an output block must follow a Python block"
            assert self.printed == block.code + "\n", f"{where}: the Python block before printed\n{self.printed}"
            return
        for line, command, expected in console_commands(block):
            shown = self.shell(command, f"{_page_id(block.path)}:{line}")
            assert _KNOWN_METHODS.sub("", shown) == _KNOWN_METHODS.sub("", expected), (
                f"{_page_id(block.path)}:{line}: `{command}` printed\n{shown}"
            )

    def shell(self, command: str, where: str) -> str:
        """What ``command`` prints: ``prunereg ...``, ``python SCRIPT`` or ``echo $?``."""
        args = shlex.split(command)
        if args[0] == "prunereg":
            result = CliRunner().invoke(main, args[1:], prog_name="prunereg")
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                raise result.exception
            self.exit_code = result.exit_code
            return result.output
        if args[0] == "python" and len(args) == 2:
            script = Path(args[1])
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(self._compiled(script.read_text(), script, 1), {"__name__": "__main__"})
            self.exit_code = 0
            return printed.getvalue()
        if command == "echo $?":
            return f"{self.exit_code}\n"
        pytest.fail(f"{where}: the docs test cannot run `{command}`; use prunereg, python or echo $?, or mark it skip")

    @staticmethod
    def _compiled(code: str, path: Path, line: int) -> object:
        # Padding with blank lines makes tracebacks point at the page's own lines.
        return compile("\n" * (line - 1) + code, str(path), "exec")


@pytest.mark.parametrize("page", _pages_with_examples(), ids=_page_id)
def test_examples_run_and_print_what_the_page_shows(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # examples save files
    reader = Reader()
    with torch.random.fork_rng():
        for block in code_blocks(page, page.read_text()):
            reader.run(block)


def test_code_blocks_finds_runnable_blocks_only() -> None:
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
            "<!-- file: train.py -->",
            "```python",
            "y = 2",
            "z = 3",
            "```",
            "```console",
            "$ python train.py",
            "```",
        ]
    )
    blocks = code_blocks(Path("page.md"), text)
    assert [(block.line, block.language, block.code, block.file) for block in blocks] == [
        (3, "python", "x = 1", None),
        (15, "python", "y = 2\nz = 3", "train.py"),
        (19, "console", "$ python train.py", None),
    ]


def test_console_commands_pair_commands_with_their_output() -> None:
    block = CodeBlock(Path("page.md"), 10, "console", "$ prunereg list\na\nb\n$ echo $?\n0")
    assert console_commands(block) == [(10, "prunereg list", "a\nb\n"), (13, "echo $?", "0\n")]


def test_a_wrong_output_on_a_page_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    block = CodeBlock(Path("page.md"), 1, "console", "$ prunereg report missing.pt\nError: something else")
    with pytest.raises(
        AssertionError, match=r"page.md:1: `prunereg report missing.pt` printed\s+Error: 'missing.pt' does"
    ):
        Reader().run(block)


def test_output_blocks_are_what_the_python_block_before_prints() -> None:
    reader = Reader()
    reader.run(CodeBlock(Path("page.md"), 1, "python", "print('a')\nprint(1 + 1)"))
    reader.run(CodeBlock(Path("page.md"), 4, "output", "a\n2"))
    with pytest.raises(AssertionError, match=r"page.md:6: the Python block before printed\s+a\s+2"):
        reader.run(CodeBlock(Path("page.md"), 6, "output", "a\n3"))


def test_readme_and_quickstart_have_examples() -> None:
    assert ROOT / "README.md" in _pages_with_examples()
    assert DOCS / "quickstart.md" in _pages_with_examples()


def test_readme_cli_example_makes_the_file_it_prunes() -> None:
    blocks = code_blocks(ROOT / "README.md", (ROOT / "README.md").read_text())
    first_console = next(index for index, block in enumerate(blocks) if block.language == "console")
    assert any('"model.safetensors"' in block.code for block in blocks[:first_console])


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
    [(prunereg, name) for name in prunereg.__all__] + [(prunereg.prune, name) for name in prunereg.prune.__all__],
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


def _setup_commands(page: Path) -> list[str]:
    """The lines of the first ```bash block under the page's set-up heading."""
    text = page.read_text()
    heading = re.search(r"^##+ (Set up|Install)\s*$", text, re.MULTILINE)
    assert heading is not None, f"{_page_id(page)} has no set-up section"
    block = re.search(r"^```bash\n(.*?)^```", text[heading.end() :], re.MULTILINE | re.DOTALL)
    assert block is not None, f"{_page_id(page)} shows no set-up command"
    return block.group(1).splitlines()


@pytest.mark.parametrize("page", [ROOT / "README.md", DOCS / "quickstart.md"], ids=_page_id)
def test_set_up_installs_what_ci_installs(page: Path) -> None:
    """The pages' install line keeps torch to the pin CI uses, so it pulls no CUDA packages on our machines."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q -c constraints.txt -e ".[dev]"' in ci
    assert re.search(r"^torch==[\d.]+$", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    assert _setup_commands(page) == [
        "python3 -m venv .venv && . .venv/bin/activate",
        'pip install -c constraints.txt -e ".[dev]" && prunereg list',
    ]


def _generated_tables_module():
    spec = importlib.util.spec_from_file_location("generated", DOCS / "_ext" / "generated.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("page", "table"), [("index.md", "methods"), ("plugins.md", "kinds")])
def test_tables_rendered_from_the_registry_are_current(page: str, table: str) -> None:
    """docs/_ext/generated.py renders them; run it when a method or a kind changes."""
    generated = _generated_tables_module()
    text = (DOCS / page).read_text()
    assert table in generated.generated_blocks(text), f"docs/{page} has no generated {table} table"
    assert generated.regenerated(text) == text, (
        f"docs/{page}: the {table} table is stale: python docs/_ext/generated.py"
    )


def test_the_methods_table_lists_every_built_in_method() -> None:
    table = _generated_tables_module().methods_table()
    builtins = [name for name in prunereg.list_methods() if prunereg.info(name).package == "prunereg"]
    assert [row.split("`")[1] for row in table.splitlines()[2:]] == builtins
    assert {"l1_unstructured", "wanda", "sparsegpt"} <= set(builtins)


def test_the_home_page_links_every_page_and_names_what_prunereg_does() -> None:
    home = (DOCS / "index.md").read_text()
    linked = {target.partition("#")[0] for target in _LINK.findall(home)}
    assert [page.name for page in sorted(DOCS.glob("*.md")) if page.name not in linked | {"index.md"}] == []
    for feature in ("prunereg.oneshot", "prunereg prune", "prunereg oneshot", "torch.nn.utils.prune"):
        assert feature in home, f"docs/index.md never mentions {feature}"


_PIP_INSTALL = re.compile(r"(?:python3? -m )?pip install ([^`\n]*)")
# pip options followed by a value that is no requirement.
_OPTION_VALUES = {"-c", "--constraint", "-r", "--requirement", "-i", "--index-url", "--extra-index-url", "-f",
                  "--find-links", "-t", "--target", "--python"}  # fmt: skip
_TEMPLATES = sorted((ROOT / "prunereg" / "_cli").glob("template*/**/*.tmpl"))


def install_requirements(text: str) -> list[str]:
    """What each ``pip install`` in ``text`` (a code block or inline code) installs, as written."""
    found = []
    for match in _PIP_INSTALL.finditer(text):
        words = shlex.split(match.group(1), comments=True)
        for stop in ("&&", "||", ";", "|"):
            words = words[: words.index(stop)] if stop in words else words
        skip_value = False
        for word in words:
            if skip_value:
                skip_value = False
            elif word in _OPTION_VALUES:
                skip_value = True
            elif not word.startswith("-"):
                found.append(word)
    return found


def installs_from_a_clone(requirement: str) -> bool:
    """prunereg and its plugins are on no package index: they install from a folder (a clone) or a git URL."""
    ours = re.match(r"prunereg\b", requirement) is not None
    return not ours or requirement.startswith("git+")


def is_a_path(requirement: str) -> bool:
    return requirement.startswith((".", "/", "~"))


def test_install_requirements_are_read_as_pip_reads_them() -> None:
    text = (
        'pip install -c constraints.txt -e ".[dev]" && prunereg list\n'
        'install the extra (`pip install "prunereg[hf]"`) or\n'
        "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu  # CPU only\n"
        "python -m pip install ./prunereg-foo\n"
    )
    assert install_requirements(text) == [".[dev]", "prunereg[hf]", "torch==2.13.0", "./prunereg-foo"]
    assert [installs_from_a_clone(r) or is_a_path(r) for r in install_requirements(text)] == [True, False, True, True]


@pytest.mark.parametrize("page", PAGES + _TEMPLATES, ids=_page_id)
def test_every_install_line_works_from_a_clone(page: Path) -> None:
    """`pip install "prunereg[hf]"` fails: prunereg is not on the package index (and the name is free to take)."""
    wrong = [r for r in install_requirements(page.read_text()) if not (is_a_path(r) or installs_from_a_clone(r))]
    assert wrong == [], f"{_page_id(page)} installs {wrong} by name; install from the clone (pip install -e '.[hf]')"


@pytest.mark.parametrize(
    ("page", "extra"),
    [("README.md", ".[dev]"), ("README.md", ".[hf]"), ("docs/llm.md", ".[hf]"), ("docs/migrating.md", ".[hf]")],
)
def test_the_pages_install_prunereg_from_the_clone(page: str, extra: str) -> None:
    assert extra in install_requirements((ROOT / page).read_text())


def _torch_pin() -> str:
    pin = re.search(r"^torch==([\d.]+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    assert pin is not None, "constraints.txt pins no torch version"
    return pin.group(1)


@pytest.mark.parametrize("page", [ROOT / "README.md", DOCS / "quickstart.md"], ids=_page_id)
def test_set_up_says_how_to_get_the_cpu_build_elsewhere(page: Path) -> None:
    """From the public index the pinned torch is the CUDA build on Linux: the page says so and gives the CPU index."""
    text = page.read_text()
    section = text[re.search(r"^##+ (Set up|Install)\s*$", text, re.MULTILINE).end() :].split("\n## ")[0]
    cpu_line = f"pip install torch=={_torch_pin()} --index-url https://download.pytorch.org/whl/cpu"
    assert cpu_line in section.splitlines(), f"{_page_id(page)} does not show `{cpu_line}` in its set-up"
    assert "nvidia-*" in section and "CI" in section  # the CUDA packages, and where the pin is a CPU wheel


def test_the_readme_announces_the_slow_tests_downloads_and_gives_the_fast_loop() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Run the tests") :].split("\n## ")[0]
    assert 'python -m pytest -m "not slow"' in section
    llm_benchmark = (ROOT / "benchmarks" / "llm.py").read_text()
    cache = re.search(r'Path\.home\(\) / "([^"]+)" / "([^"]+)"', llm_benchmark)
    assert cache is not None and f"~/{cache[1]}/{cache[2]}/" in section  # where the slow tests write
    assert "PRUNEREG_LLM_CACHE" in llm_benchmark and "PRUNEREG_LLM_CACHE" in section
    assert re.search(r"\d+ MB", section) and "minutes" in section
