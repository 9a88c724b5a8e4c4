"""Options several ``open1b-audit`` commands share (the audit commands in ``cli.py`` and
the explorer's in ``site/cli.py``): what an auditor obtains out of band and passes in."""
from __future__ import annotations

import click


def _hash_param(ctx, param, value):
    from open1b_train.chain import is_hash

    if value is not None and not is_hash(value.lower()):
        raise click.BadParameter(f"{value!r} is not a run hash (64 hex digits)")
    return None if value is None else value.lower()


def expect_run_hash(f):
    return click.option(
        "--expect-run-hash", "expect", default=None, metavar="H", callback=_hash_param,
        help="The run hash its owner published: refuse a log that does not end in it.")(f)


def trusted_keys(f):
    return click.option(
        "--trusted-keys", "trusted_keys", type=click.Path(dir_okay=False), default=None,
        help="Count only certificates signed by the keys in this file (lines of 64-hex "
             "Ed25519 public keys and/or PEM public keys as keygen writes KEY.pub).")(f)
