"""A run's log as the audit commands read it: present, complete, pinned to the run hash its
owner published (``--expect-run-hash``) and, where a command needs it, one chain - refused
with one line (``click.ClickException``) otherwise."""
from __future__ import annotations

import os

import click


def log_of(run: str, expect: str | None = None):
    """RUN's log (``runlog.Log``), refused (one line) unless it ends in ``expect``."""
    from open1b_train import chain
    from open1b_train import runlog

    if not os.path.lexists(runlog.path_of(run)):
        raise click.ClickException(f"{run}: no steps.jsonl (not a run directory?)")
    log = runlog.read_log(run)
    if not log.lines:
        raise click.ClickException(f"{run}: steps.jsonl has no complete line")
    if expect is not None:
        f = chain.pin(log.lines, expect, log.partial_bytes)
        if f is not None:
            raise click.ClickException(f"{run} is not the published run: {f}")
    return log


def chained(run: str, expect: str | None, why: str) -> list[dict]:
    """RUN's lines, refused (one line) unless they are one chain (and end in ``expect``):
    ``why`` says what a broken chain cannot be used for."""
    from open1b_train import chain

    lines = log_of(run, expect).lines
    f = chain.check(lines)
    if f is not None:
        raise click.ClickException(f"{run}: the log is not one chain ({f}); {why}")
    return lines


def cut_note(log) -> str | None:
    if not log.partial_bytes:
        return None
    return (f"note: {log.path} line {log.partial_line} is cut off ({log.partial_bytes} bytes, "
            f"no newline); it is not part of the chain and was not read")
