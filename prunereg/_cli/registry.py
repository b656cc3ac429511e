"""Commands that show the method registry and start new plugins.

``list`` and ``plugins`` read registrations only: they import neither torch nor
any plugin's implementation (``plugins`` imports the targets to check them).
Plugin problems go to stderr; the exit status is 0 unless strict mode
(``PRUNEREG_STRICT_PLUGINS=1``) is on and there was a problem. Everything a
plugin wrote (names, summaries, docstrings, error messages) is printed through
:func:`prunereg._text.printable`: no control character or escape sequence of
theirs reaches the terminal. JSON output is escaped by ``json`` itself.
"""

from __future__ import annotations

import inspect
import json
import os
import shlex
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from prunereg._cli.app import main
from prunereg._plugins.kinds import kind as kind_of
from prunereg._plugins.kinds import kind_names
from prunereg._plugins.registry import constructor_parameters
from prunereg._text import describe, printable

if TYPE_CHECKING:
    from prunereg._plugins.registry import Registry


@main.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
@click.option("--kind", type=click.Choice(kind_names()), help="Only methods of this kind.")
def list_command(as_json: bool, kind: str | None) -> None:
    """List the registered pruning methods."""
    registry = _loaded_registry()
    rows = [
        {**info.as_dict(), "runs_with": kind_of(info.kind).commands}
        for info in (registry.methods[name] for name in registry.names(kind))
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        _echo_table(rows, ("name", "kind", "runs_with", "package", "version", "summary"))
    _exit_if_strict(registry, registry.problems)


def _runs_with(kind: str, cls: type) -> list[str]:
    """The commands that run a method of ``kind`` and class ``cls``."""
    if kind == "calibrated":
        return ["oneshot", "prune"] if getattr(cls, "runs_without_calibration", lambda: False)() else ["oneshot"]
    if kind == "shrink":
        return ["shrink"]
    if kind == "recovery":  # all from Python (prunereg.recover); those that work block by block in shrink's pass
        return ["shrink --recover"] if getattr(cls, "SCOPE", None) == "block" else []
    return ["prune", "prune --global"] if kind == "unstructured" else ["prune"]


@main.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def plugins_command(as_json: bool) -> None:
    """List the plugins, how loading each went, and their methods.

    Status: loaded, error, conflict, blocked (PRUNEREG_BLOCK_PLUGINS) or
    disabled (PRUNEREG_DISABLE_PLUGIN_AUTOLOAD, PRUNEREG_PLUGINS). Every
    method's class is imported to check it.
    """
    registry = _loaded_registry()
    failures = registry.check_targets()
    _echo_problems(failures)
    rows = [plugin.as_dict() for plugin in registry.plugins.values()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        _echo_table(
            [{**row, "methods": ", ".join(row["methods"]), "error": row["error"] or ""} for row in rows],
            ("name", "package", "version", "status", "methods", "error"),
        )
    _exit_if_strict(registry, registry.problems + failures)


@main.command("info")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of text.")
def info_command(name: str, as_json: bool) -> None:
    """Describe the method NAME (or PLUGIN:NAME): summary, kind, package, docstring, parameters."""
    from prunereg._plugins.registry import PluginError, PluginWarning, UnknownMethodError

    registry = _loaded_registry()
    try:
        info = registry.info(name)
        with warnings.catch_warnings():  # the error below says it all
            warnings.simplefilter("ignore", PluginWarning)
            cls = registry.resolve(name)
    except (UnknownMethodError, PluginError) as error:
        raise click.ClickException(printable(str(error))) from error
    details = {
        **info.as_dict(),
        "runs_with": _runs_with(info.kind, cls),
        "doc": inspect.getdoc(cls),
        "parameters": _parameters(cls),
    }
    if as_json:
        click.echo(json.dumps(details, indent=2))
    else:
        click.echo(printable(f"{info.name} ({info.kind}): {info.summary}"))
        click.echo(f"from {info.label}, class {printable(info.target)}")
        commands = ", ".join(f"prunereg {command}" for command in details["runs_with"])
        click.echo("runs with: " + (commands or kind_of(info.kind).commands))
        click.echo(f"parameters: {_signature(details['parameters'])}")
        if details["doc"]:
            click.echo("\n" + "\n".join(printable(line) for line in details["doc"].splitlines()))
    _exit_if_strict(registry, registry.problems)


@main.command("new-plugin")
@click.argument("name")
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--kind",
    type=click.Choice(["unstructured", "calibrated", "shrink", "recovery", "importance"]),
    default="unstructured",
    show_default=True,
    help="A mask method like torch's, a calibrated method for prunereg.oneshot, a shrink method for prunereg.shrink, "
    "a recovery method for prunereg.recover, an importance for prunereg.slim.",
)
def new_plugin_command(name: str, directory: Path | None, kind: str) -> None:
    """Write a complete plugin package prunereg-NAME into DIRECTORY (default ./prunereg-NAME).

    The package has the entry point, a working method, tests using
    prunereg.testing and a README; `pip install DIRECTORY && pytest
    DIRECTORY` passes as written.
    """
    from prunereg._cli.scaffold import PluginNames, of_kind, write_plugin

    try:
        names = of_kind(PluginNames.from_name(name), kind)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="NAME") from error
    directory = directory if directory is not None else Path(names.distribution)
    try:
        if directory.exists() and any(directory.iterdir()):
            raise click.ClickException(f"{directory} already exists and is not empty; name another DIRECTORY")
        written = write_plugin(names, directory)
    except OSError as error:  # a name or path too long for the filesystem, no permission, a full disk
        raise click.ClickException(
            f"cannot write the plugin into {printable(str(directory))}: {describe(error)}"
        ) from error
    for path in written:
        click.echo(f"wrote {path}")
    where = _shell_path(directory)
    click.echo(
        f"\nmethod {names.method!r} in {names.distribution}; install it from its folder and run its tests:\n"
        f"  pip install {where} && prunereg list && python -m pytest {where}"
    )


def _shell_path(directory: Path) -> str:
    """``directory`` as pip reads it as a local folder (``./x``, not ``x``, a name on the package index), quoted."""
    text = str(directory)
    if not directory.is_absolute() and not text.startswith(os.pardir):
        text = os.curdir + os.sep + text
    return shlex.quote(text)


def _loaded_registry() -> Registry:
    """The registry, its load problems echoed to stderr (never raised: the command still answers)."""
    from prunereg._plugins.loading import loaded_registry

    registry = loaded_registry()
    _echo_problems(registry.problems)
    return registry


def _echo_problems(problems: list[str]) -> None:
    for problem in problems:
        click.echo(f"warning: {printable(problem)}", err=True)


def _exit_if_strict(registry: Registry, problems: list[str]) -> None:
    if registry.strict and problems:
        click.echo("error: plugin problems above (PRUNEREG_STRICT_PLUGINS is set)", err=True)
        raise SystemExit(1)


def _echo_table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    table = [[c.upper().replace("_", " ") for c in columns]] + [
        [printable(str(row[c] or "-")) for c in columns] for row in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns) - 1)]
    for line in table:
        click.echo(("  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1]).rstrip())


def _parameters(cls: type) -> list[dict[str, Any]] | None:
    """The constructor's parameters: name, annotation, default (as repr) and whether required.

    None when they cannot be read: no signature, or one whose defaults or
    annotations fail to print (plugin code may raise anything there).
    """
    parameters = constructor_parameters(cls)
    if parameters is None:
        return None
    try:
        return [
            {
                "name": p.name,
                "annotation": _annotation(p.annotation),
                "default": None if p.default is p.empty else repr(p.default),
                "required": p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD),
            }
            for p in parameters.values()
        ]
    except Exception:  # a default whose repr raises, say: the rest of `info` is still worth showing
        return None


def _annotation(annotation: Any) -> str | None:
    if annotation is inspect.Parameter.empty:
        return None
    # Under `from __future__ import annotations` an annotation is already its source text.
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _signature(parameters: list[dict[str, Any]] | None) -> str:
    if parameters is None:
        return "unknown (the constructor's signature cannot be read)"
    return printable(", ".join(_format_parameter(p) for p in parameters)) or "none"


def _format_parameter(parameter: dict[str, Any]) -> str:
    text = parameter["name"]
    if parameter["annotation"]:
        text += f": {parameter['annotation']}"
    if parameter["default"] is not None:
        text += f" = {parameter['default']}"
    return text
