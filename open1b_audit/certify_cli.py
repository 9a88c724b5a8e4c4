"""``open1b-audit keygen``, ``assign`` and ``coverage``: the commands of certifying a run
together - a signing key, the split of its steps among auditors, and what the certificates
they sign cover (registered on ``open1b_audit.cli.main``)."""
from __future__ import annotations

import os
import sys

import click

from open1b.cli import ERRORS, emit, fail
from open1b_audit.options import (announcement, expect_recipe, expect_run_hash,
                                   trusted_keys as trusted_keys_option)
from open1b_audit.pinned import chained


@click.command("keygen")
@click.argument("key", type=click.Path(dir_okay=False))
def keygen_cmd(key) -> None:
    """Make an Ed25519 key for signing certificates (KEY and KEY.pub)."""
    from open1b_audit import certificate

    try:
        pub = certificate.keygen(key)
    except ERRORS as e:
        fail(e)
    click.echo(f"wrote {key} (private, mode 600) and {key}.pub; public key {pub}")
    tree = certificate.git_work_tree(key)
    if tree is not None:
        click.echo(f"warning: {key} is a private key inside the git work tree {tree}; keep it "
                   f"out of every commit (this repository's .gitignore ignores *.pem), or "
                   f"keep keys outside, e.g. ~/.open1b/", err=True)


@click.command("assign")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--auditors", type=click.IntRange(min=1), required=True, help="K auditors.")
@click.option("--redundancy", type=click.IntRange(min=1), default=1, show_default=True,
              help="Distinct auditors per step.")
@click.option("--seed", type=int, required=True, help="The assignment seed (publish it).")
@expect_run_hash
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def assign_cmd(run, auditors, redundancy, seed, expect, as_json) -> None:
    """Which steps each of K auditors replays so every step is covered r times. The log
    must be one chain (and end in --expect-run-hash): a split of a cut or edited log
    leaves the published run's other steps to nobody."""
    from open1b_audit.assign import assign

    try:
        lines = chained(run, expect, "its steps cannot be split among auditors")
        steps = list(range(1, len(lines)))
        a = assign(steps, auditors, redundancy, seed)
    except ERRORS as e:
        fail(e)
    rep = {"run": run, "steps": len(steps), "auditors": auditors, "redundancy": redundancy,
           "seed": seed, "run_hash": lines[-1].get("hash"), "expected_run_hash": expect,
           "assignment": {str(k): v for k, v in a.items()}}
    if expect is None:
        rep["warning"] = ("no --expect-run-hash: the split covers the steps this log holds, "
                          "which may not be the published run's")
        click.echo(f"warning: {rep['warning']}", err=True)
    emit(rep, as_json, lambda r: [click.echo(f"auditor {k:>4}: {len(v)} steps: "
                                              f"{', '.join(map(str, v[:12]))}"
                                              f"{' ...' if len(v) > 12 else ''}")
                                   for k, v in a.items()])


@click.command("coverage")
@click.argument("run", type=click.Path(file_okay=False))
@click.argument("certs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--redundancy", type=click.IntRange(min=1), default=1, show_default=True,
              help="Distinct signing keys a step needs to count as covered.")
@trusted_keys_option
@expect_run_hash
@expect_recipe
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def coverage_cmd(run, certs, redundancy, trusted_keys, expect, expect_preset, expect_mix,
                 as_json) -> None:
    """Which steps of RUN the certificates cover (signed, by distinct keys, on the announced
    recipe), the gaps, certificates off the recipe, any conflict, and whether the released
    weights (the last step's checkpoint) are the log's; exits 1 on a conflict, an off-recipe
    certificate or released weights that differ."""
    from open1b_audit import certificate
    from open1b_audit.coverage import coverage, read_all, spans
    from open1b_train.published import hashed_config, released_weights

    paths = []
    for c in certs:
        if os.path.isdir(c):
            paths.extend(sorted(os.path.join(c, n) for n in os.listdir(c) if n.endswith(".json")))
        else:
            paths.append(c)
    try:
        trusted = certificate.read_trusted_keys(trusted_keys) if trusted_keys else None
        lines = chained(run, expect, "certificates cannot be checked against it")
        announce = announcement(expect, expect_preset, expect_mix)
        genesis = lines[0]["genesis"]
        try:
            preset, why = hashed_config(run, genesis).preset, None
        except ERRORS as e:           # no checked config: no preset to compare or announce
            preset, why = None, f"its config cannot be checked ({e})"
        why = announce.refusal(genesis, preset) or (why if expect_preset else None)
        rep = coverage(lines, read_all(paths), redundancy, trusted, announce, why)
        rep["preset"], rep["mix_fingerprint"] = preset, genesis.get("mix_fingerprint")
        rep["final_checkpoint"] = released_weights(run, lines)
    except ERRORS as e:
        fail(e)
    if trusted is None:
        rep["warning"] = (f"no --trusted-keys: any key counts (anyone can make one); "
                          f"{rep['keys_counted']} distinct key(s) counted")
        click.echo(f"warning: {rep['warning']}", err=True)

    def human(r):
        whose = "any key" if trusted is None else f"{len(trusted)} trusted key(s)"
        click.echo(f"{run}: {r['covered']} of {r['steps']} steps certified by >= "
                   f"{redundancy} distinct signing key(s) ({r['keys_counted']} counted, of "
                   f"{whose}); run hash {str(r['run_hash'])[:16]}...")
        if r["gaps"]:
            click.echo(f"gaps ({len(r['gaps'])} steps): {spans(r['gaps'])}")
        for c in r["unsigned"]:
            click.echo(f"unsigned (not counted) step {c['step']}: {c['certificate']} "
                       f"(auditor {c['auditor']!r})")
        for c in r["untrusted"]:
            click.echo(f"untrusted key (not counted) step {c['step']}: {c['certificate']} "
                       f"(key {c['key'][:16]}...)")
        click.echo(f"recipe: the run claims preset {r['preset']!r} on mix "
                   f"{r['mix_fingerprint']}" + "".join(
                       f"; announced {k} {v!r}" for k, v in r["announced"].items() if v))
        if r["run_recipe"]:
            click.echo(f"NOT THE ANNOUNCED RECIPE: {r['run_recipe']}")
        if r["off_recipe"]:
            click.echo(f"certified but off the recipe (not counted): "
                       f"{len(r['off_recipe_steps'])} step(s) certified only off recipe")
        for c in r["off_recipe"]:
            click.echo(f"off recipe step {c['step']}: {c['certificate']}: {c['why']}")
        if announce.unpinned():
            click.echo(f"not pinned: {', '.join(announce.unpinned())} (the run is checked "
                       f"against itself, not against what its owner announced)")
        fc = r["final_checkpoint"]
        click.echo(f"released weights (step {fc['step']}): " + (
            "the log's - compared" if fc["matches"] else
            f"DIFFER: {fc['detail']}" if fc["compared"] else f"not compared: {fc['detail']}"))
        for c in r["conflicts"]:
            click.echo(f"CONFLICT step {c['step']}: {c['certificate']}: {c['why']}")
    emit(rep, as_json, human)
    if (rep["conflicts"] or rep["off_recipe"] or rep["run_recipe"] or
            rep["final_checkpoint"]["matches"] is False):
        sys.exit(1)


def register(main: click.Group) -> None:
    for cmd in (keygen_cmd, assign_cmd, coverage_cmd):
        main.add_command(cmd)
