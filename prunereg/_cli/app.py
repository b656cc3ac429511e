"""The ``prunereg`` command group, which every command module attaches its commands to."""

from __future__ import annotations

import click

from prunereg import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="prunereg")
def main() -> None:
    """Prune PyTorch models with any registered pruning method."""
