"""``open1b-data``: the thin click layer. Each command parses its options, logs the
resolved configuration, and calls one library function; commands live beside the
library code they drive (``cli_build``, ``cli_stream``). Failures and exit codes are the
project's shell's (``open1b.cli``): one line, never a traceback.
"""
from __future__ import annotations

import click

from open1b.cli import Cli
from open1b_data import __version__


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="open1b-data")
def main() -> None:
    """Build Mix 0626 and inspect the topologically invariant stream."""


def _register() -> None:
    from open1b_data.cli import build as cli_build
    from open1b_data.cli import check as cli_check
    from open1b_data.cli import stream as cli_stream

    for module in (cli_build, cli_check, cli_stream):
        for command in module.COMMANDS:
            main.add_command(command)


_register()
