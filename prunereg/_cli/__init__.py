"""The ``prunereg`` command line. Commands import torch only when they run.

Each command module attaches its commands to :func:`main` when imported, below.
"""

from __future__ import annotations

import click

from prunereg import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="prunereg")
def main() -> None:
    """Prune PyTorch models with any registered pruning method."""


from prunereg._cli import registry as _registry  # noqa: E402  (commands attach to main)
from prunereg._cli import checkpoint as _checkpoint  # noqa: E402
from prunereg._cli import oneshot as _oneshot  # noqa: E402
