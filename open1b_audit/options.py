"""Options several ``open1b-audit`` commands share (the audit commands in ``cli.py`` and
``certify_cli.py``, the explorer's in ``site/cli.py``): what an auditor obtains out of band
and passes in."""
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


def _fingerprint_param(ctx, param, value):
    from open1b_train.chain import is_hash

    if value is not None and not is_hash(value.lower()):
        raise click.BadParameter(f"{value!r} is not a mix fingerprint (64 hex digits, as "
                                 f"`open1b-data verify` prints it)")
    return None if value is None else value.lower()


def _preset_param(ctx, param, value):
    from open1b_train.config import PRESETS

    if value is not None and value not in PRESETS:
        raise click.BadParameter(f"{value!r} is not a preset; choose one of {sorted(PRESETS)}")
    return value


def expect_recipe(f):
    """--expect-preset and --expect-mix: the recipe its owner announced (recipe.py)."""
    f = click.option("--expect-mix", "expect_mix", default=None, metavar="FINGERPRINT",
                     callback=_fingerprint_param,
                     help="The mix fingerprint its owner announced: refuse a run trained on "
                          "another mix.")(f)
    return click.option("--expect-preset", "expect_preset", default=None, metavar="NAME",
                        callback=_preset_param,
                        help="The preset its owner announced: refuse a run that claims "
                             "another or departs from it (schedule and held-out rule "
                             "included).")(f)


def announcement(expect, expect_preset, expect_mix):
    from open1b_train.recipe import Announcement

    return Announcement(run_hash=expect, preset=expect_preset, mix=expect_mix)


def recipe_lines(rc: dict | None, announce) -> list[str]:
    """The recipe a run was checked against, in a report's normal output."""
    if not rc:
        return []
    out = [f"recipe: preset {rc['preset']!r}, mix {rc['mix_fingerprint']}, schedule "
           f"{rc['schedule']}"]
    if rc["departures"]:
        out.append("RECIPE: the run departs from the published "
                   f"{rc['preset']!r} preset in " + ", ".join(
                       f"{d['field']} ({d['preset']!r} -> {d['run']!r})"
                       for d in rc["departures"]))
    else:
        out.append("recipe: no departure from the preset")
    missing = announce.unpinned()
    if missing:
        out.append(f"not pinned: {', '.join(missing)} (without them the run is checked "
                   f"against itself, not against what its owner announced)")
    return out
