"""``open1b-data``: the thin click layer. Each command parses its options, logs the
resolved configuration, and calls one library function; commands live beside the
library code they drive (``cli_build``, ``cli_stream``).

Failures are one line on standard error, never a traceback (``Cli.main``):

* exit 1: ``Error: <message>`` for an error the command or the library names
  (``Open1bDataError``: the message carries the bad value and what to do);
* exit 2: ``Error: <message>; see 'open1b-data CMD --help'`` for a usage error (click's
  own, which would print the usage block and a hint on three more lines);
* exit 3: ``internal error: <type>: <message> (set OPEN1B_DEBUG=1 for the traceback)`` for
  anything else - a bug, since every failure a user can cause has its own message. With
  ``OPEN1B_DEBUG=1`` the exception propagates with its traceback.

Messages that hold line breaks (a library's multi-line text) are joined into one line.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import click

from open1b_data import __version__
from open1b_data.errors import Open1bDataError

INTERNAL_ERROR = 3


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _fail(message: str, code: int) -> None:
    click.echo(_one_line(message), err=True)
    sys.exit(code)


class Cli(click.Group):
    """The command group whose ``main`` turns every failure into one line (module
    docstring). ``main`` is what both the console script and click's test runner call."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:
            e.show()        # the group's help, as asked for by giving no command
            sys.exit(e.exit_code)
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else "open1b-data"
            message = e.format_message().rstrip(".")
            sep = " " if message.endswith("?") else "; "     # "Did you mean '--out'?"
            _fail(f"Error: {message}{sep}see '{where} --help'", e.exit_code)
        except click.ClickException as e:
            _fail(f"Error: {e.format_message()}", e.exit_code)
        except click.exceptions.Abort:
            _fail("Aborted.", 1)
        except Open1bDataError as e:  # a command that forgot to convert it
            _fail(f"Error: {e}", 1)
        except Exception as e:
            if os.environ.get("OPEN1B_DEBUG") == "1":
                raise
            _fail(f"internal error: {type(e).__name__}: {e} (set OPEN1B_DEBUG=1 for the "
                  f"traceback)", INTERNAL_ERROR)
        # A command returns None; ctx.exit(n) and --help / --version arrive as an int.
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="open1b-data")
def main() -> None:
    """Build Mix 0626 and inspect the topologically invariant stream."""


def _register() -> None:
    from open1b_data.cli import build as cli_build
    from open1b_data.cli import stream as cli_stream

    for module in (cli_build, cli_stream):
        for command in module.COMMANDS:
            main.add_command(command)


_register()
