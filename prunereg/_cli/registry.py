"""Commands that show the method registry."""

from __future__ import annotations

import json

import click

from prunereg._cli import main


@main.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
@click.option("--kind", type=click.Choice(["unstructured", "structured", "global"]), help="Only methods of this kind.")
def list_command(as_json: bool, kind: str | None) -> None:
    """List the registered pruning methods."""
    from prunereg._plugins import registry

    reg = registry()
    rows = [reg.methods[name].as_dict() for name in reg.names()]
    if kind:
        rows = [row for row in rows if row["kind"] == kind]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    columns = ("name", "kind", "package", "version", "summary")
    table = [[c.upper() for c in columns]] + [[str(row[c] or "-") for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns) - 1)]
    for line in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1])
