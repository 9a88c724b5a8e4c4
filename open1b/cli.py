"""The shell every command-line tool of the project shares: exit codes, the error line,
``--json`` output.

Failures are one line on standard error, never a traceback (``Cli.main``):

* exit 1: ``Error: <message>`` for an error the command or the library names (any
  ``open1b.errors.Open1bError``: the message carries the bad value and what to do), and for
  a check that found a difference (the command reports it first, then exits 1);
* exit 2: ``Error: <message>; see '<tool> CMD --help'`` for a usage error (click's own,
  which would print the usage block and a hint on three more lines);
* exit 1 too, naming the extra to install, for an optional package a command needs and
  this environment lacks (``EXTRAS``: transformers for ``export``, ...);
* exit 3: ``internal error: <type>: <message> (set OPEN1B_DEBUG=1 for the traceback)`` for
  anything else - a bug, since every failure a user can cause has its own message. With
  ``OPEN1B_DEBUG=1`` the exception propagates with its traceback.

Messages that hold line breaks (a library's multi-line text) are joined into one line.
Commands call ``fail(e)`` for an error they caught (``ERRORS``) and ``emit`` to print one
JSON object with ``--json`` or the human form otherwise.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from open1b.errors import Open1bError

INTERNAL_ERROR = 3

# OpenMP threads (torch's and the project's C loops share libgomp) spin while they wait for
# work by default. On a machine where another process holds a core, every parallel region
# then waits for a spinning thread the kernel has descheduled: with one of 2 cores busy, 6
# demo steps on 2 spinning threads ran at 0.64x one thread, on passive ones 0.94x (idle: 1.32x
# and 1.07x; benchmarks/results/results-threads.md). Passive waiting removes that cliff for a
# little idle speed; the commands set it before torch loads libgomp (no command imports torch
# at import time), unless the user chose a policy.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


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
            where = e.ctx.command_path if e.ctx is not None else self.name
            message = e.format_message().rstrip(".")
            sep = " " if message.endswith("?") else "; "     # "Did you mean '--out'?"
            _fail(f"Error: {message}{sep}see '{where} --help'", e.exit_code)
        except click.ClickException as e:
            _fail(f"Error: {e.format_message()}", e.exit_code)
        except click.exceptions.Abort:
            _fail("Aborted.", 1)
        except Open1bError as e:  # a command that forgot to convert it
            _fail(f"Error: {e}", 1)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] not in EXTRAS:
                raise                   # not an optional package: a bug, reported below
            _fail(f"Error: this command needs the Python package {e.name!r}, which the "
                  f"project's {EXTRAS[e.name.split('.')[0]]!r} extra installs: "
                  f"pip install -e '.[{EXTRAS[e.name.split('.')[0]]}]' (in the repository, "
                  f"with the environment's pip, e.g. .venv/bin/pip)", 1)
        except Exception as e:
            if os.environ.get("OPEN1B_DEBUG") == "1":
                raise
            _fail(f"internal error: {type(e).__name__}: {e} (set OPEN1B_DEBUG=1 for the "
                  f"traceback)", INTERNAL_ERROR)
        # A command returns None; ctx.exit(n) and --help / --version arrive as an int.
        sys.exit(rv if isinstance(rv, int) else 0)


ERRORS = (Open1bError, ValueError, OSError)     # what a command reports as one line
# optional packages (pyproject.toml's extras) -> the extra that installs them: a command that
# needs one says which extra to install instead of failing as a bug
EXTRAS = {"transformers": "eval", "lm_eval": "eval", "triton": "gpu"}


def fail(e: Exception) -> None:
    """Report a caught error as the command's one-line failure (exit 1)."""
    raise click.ClickException(str(e)) from None


def emit(obj: Any, as_json: bool, human: Callable[[Any], Any]) -> None:
    """One JSON object with ``--json``, else the command's human form of it."""
    if as_json:
        click.echo(json.dumps(obj, indent=1, default=str))
    else:
        human(obj)
