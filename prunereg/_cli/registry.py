"""Commands that show the method registry and start new plugins.

``list`` and ``plugins`` read registrations only: they import neither torch nor
any plugin's implementation (``plugins`` imports the targets to check them).
Plugin problems go to stderr; the exit status is 0 unless strict mode
(``PRUNEREG_STRICT_PLUGINS=1``) is on and there was a problem.
"""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from prunereg._cli.app import main
from prunereg._registry import KINDS, constructor_parameters

if TYPE_CHECKING:
    from prunereg._registry import Registry


@main.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
@click.option("--kind", type=click.Choice(KINDS), help="Only methods of this kind.")
def list_command(as_json: bool, kind: str | None) -> None:
    """List the registered pruning methods."""
    registry = _loaded_registry()
    rows = [registry.methods[name].as_dict() for name in registry.names(kind)]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        _echo_table(rows, ("name", "kind", "package", "version", "summary"))
    _exit_if_strict(registry, registry.problems)


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
    from prunereg._registry import PluginError, PluginWarning, UnknownMethodError

    registry = _loaded_registry()
    try:
        info = registry.info(name)
        with warnings.catch_warnings():  # the error below says it all
            warnings.simplefilter("ignore", PluginWarning)
            cls = registry.resolve(name)
    except (UnknownMethodError, PluginError) as error:
        raise click.ClickException(str(error)) from error
    details = {**info.as_dict(), "doc": inspect.getdoc(cls), "parameters": _parameters(cls)}
    if as_json:
        click.echo(json.dumps(details, indent=2))
        return
    origin = f"{info.package} {info.version}" if info.package else "this process"
    click.echo(f"{info.name} ({info.kind}): {info.summary}")
    click.echo(f"from plugin {info.plugin!r} ({origin}), class {info.target}")
    signature = ", ".join(_format_parameter(p) for p in details["parameters"])
    click.echo(f"parameters: {signature or 'none'}")
    if details["doc"]:
        click.echo("\n" + details["doc"])


@main.command("new-plugin")
@click.argument("name")
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--kind",
    type=click.Choice(["unstructured", "calibrated"]),
    default="unstructured",
    show_default=True,
    help="A mask method like torch's, or a calibrated method for prunereg.oneshot.",
)
def new_plugin_command(name: str, directory: Path | None, kind: str) -> None:
    """Write a complete plugin package prunereg-NAME into DIRECTORY (default ./prunereg-NAME).

    The package has the entry point, a working method, tests using
    prunereg.testing and a README; `pip install DIRECTORY && pytest
    DIRECTORY` passes as written.
    """
    from dataclasses import replace

    from prunereg._cli.scaffold import PluginNames, write_plugin

    try:
        names = replace(PluginNames.from_name(name), kind=kind)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="NAME") from error
    directory = directory if directory is not None else Path(names.distribution)
    if directory.exists() and any(directory.iterdir()):
        raise click.ClickException(f"{directory} already exists and is not empty; name another DIRECTORY")
    for path in write_plugin(names, directory):
        click.echo(f"wrote {path}")
    click.echo(
        f"\nmethod {names.method!r} in {names.distribution}; next:\n"
        f"  pip install {directory} && prunereg list && python -m pytest {directory}"
    )


def _loaded_registry() -> Registry:
    """The registry, its load problems echoed to stderr (never raised: the command still answers)."""
    from prunereg._plugins import loaded_registry

    registry = loaded_registry()
    _echo_problems(registry.problems)
    return registry


def _echo_problems(problems: list[str]) -> None:
    for problem in problems:
        click.echo(f"warning: {problem}", err=True)


def _exit_if_strict(registry: Registry, problems: list[str]) -> None:
    if registry.strict and problems:
        click.echo("error: plugin problems above (PRUNEREG_STRICT_PLUGINS is set)", err=True)
        raise SystemExit(1)


def _echo_table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    table = [[c.upper() for c in columns]] + [[str(row[c] or "-") for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns) - 1)]
    for line in table:
        click.echo(("  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1]).rstrip())


def _parameters(cls: type) -> list[dict[str, Any]]:
    """The constructor's parameters: name, annotation, default (as repr) and whether required."""
    parameters = (constructor_parameters(cls) or {}).values()
    return [
        {
            "name": p.name,
            "annotation": _annotation(p.annotation),
            "default": None if p.default is p.empty else repr(p.default),
            "required": p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD),
        }
        for p in parameters
    ]


def _annotation(annotation: Any) -> str | None:
    if annotation is inspect.Parameter.empty:
        return None
    # Under `from __future__ import annotations` an annotation is already its source text.
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _format_parameter(parameter: dict[str, Any]) -> str:
    text = parameter["name"]
    if parameter["annotation"]:
        text += f": {parameter['annotation']}"
    if parameter["default"] is not None:
        text += f" = {parameter['default']}"
    return text
