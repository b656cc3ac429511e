"""``prunereg new-plugin``: a complete plugin package written from the templates in ``template/``.

Templates are plain files ending in ``.tmpl`` whose ``{{placeholders}}`` are
replaced by the plugin's names; ``package/`` becomes the plugin's module folder.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from prunereg import __version__
from prunereg._plugins.registry import MAX_NAME_LENGTH

if TYPE_CHECKING:
    from importlib.abc import Traversable

#: The template folders each kind of plugin is written from.
TEMPLATES = {
    "unstructured": ("template",),
    "calibrated": ("template", "template_calibrated"),
    "shrink": ("template", "template_shrink"),
    "recovery": ("template", "template_recovery"),
    "importance": ("template", "template_importance"),
}
_NAME = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@dataclass(frozen=True)
class PluginNames:
    """Every name a plugin ``foo-bar`` needs, following prunereg's conventions."""

    method: str  # foo_bar: the method name, and the entry-point (plugin) name
    distribution: str  # prunereg-foo-bar
    module: str  # prunereg_foo_bar
    class_name: str  # FooBarPruning
    prunereg_version: str
    kind: str = "unstructured"  # or "calibrated", "shrink", "recovery", "importance": template_<kind>/ over template/

    @classmethod
    def from_name(cls, name: str) -> PluginNames:
        """Names from ``foo-bar``, ``foo_bar`` or ``prunereg-foo-bar``."""
        bare = re.sub(r"^prunereg[-_]", "", name.strip())
        if not _NAME.fullmatch(bare) or len(bare) > MAX_NAME_LENGTH:
            raise ValueError(
                f"{_shortened(name)!r} is not a plugin name: use lowercase letters, digits, '-' or '_', "
                f"starting with a letter, at most {MAX_NAME_LENGTH} characters"
            )
        method = bare.replace("-", "_")
        return cls(
            method=method,
            distribution=f"prunereg-{bare.replace('_', '-')}",
            module=f"prunereg_{method}",
            class_name="".join(part.capitalize() for part in method.split("_")) + "Pruning",
            prunereg_version=__version__,
        )


def of_kind(names: PluginNames, kind: str) -> PluginNames:
    """``names`` for a plugin of ``kind``: an importance class is ``FooBarImportance``, else ``FooBarPruning``."""
    suffix = "Importance" if kind == "importance" else "Pruning"
    return replace(names, kind=kind, class_name=names.class_name.removesuffix("Pruning") + suffix)


def render(names: PluginNames) -> dict[Path, str]:
    """The plugin's files, by path relative to its folder."""
    values = asdict(names)
    files = {}
    for folder in TEMPLATES[names.kind]:  # a later folder replaces an earlier one's files of the same name
        for template, relative in _templates(resources.files("prunereg._cli") / folder, Path()):
            text = _PLACEHOLDER.sub(lambda match: values[match.group(1)], template.read_text(encoding="utf-8"))
            files[_destination(relative, names)] = text
    return files


def write_plugin(names: PluginNames, directory: Path) -> list[Path]:
    """Write the plugin's files under ``directory`` (absent or empty); returns their paths.

    All or nothing: if a file cannot be written (``OSError``), everything
    written so far is removed, with the folders created for it.
    """
    created = _first_missing(directory)
    written = []
    try:
        for relative, text in sorted(render(names).items()):
            path = directory / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(path)
    except OSError:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        else:
            _remove_contents(directory)
        raise
    return written


def _first_missing(directory: Path) -> Path | None:
    """The outermost of ``directory`` and its parents that does not exist yet, if any."""
    missing = None
    for path in (directory, *directory.parents):
        if path.exists():
            break
        missing = path
    return missing


def _remove_contents(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _shortened(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else f"{name[:limit]}..."


def _templates(folder: Traversable, relative: Path) -> list[tuple[Traversable, Path]]:
    found = []
    for entry in folder.iterdir():
        if entry.is_dir():
            found += _templates(entry, relative / entry.name)
        elif entry.name.endswith(".tmpl"):
            found.append((entry, relative / entry.name.removesuffix(".tmpl")))
    return found


def _destination(relative: Path, names: PluginNames) -> Path:
    parts = [names.module if part == "package" else part for part in relative.parts]
    if parts[-1] == "test_method.py":
        parts[-1] = f"test_{names.method}.py"
    return Path(*parts)
