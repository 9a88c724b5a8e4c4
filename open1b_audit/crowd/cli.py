"""The crowd's commands (``join``, ``doctor``, ``publish``) and a run URL for every audit
command: the thin click layer over ``open1b_audit.crowd`` (registered by
``open1b_audit.cli``).

``run_url`` is the one helper the commands that read a run call first (``chain``,
``replay``, ``bisect``, ``verify-model``): a local run directory passes through unchanged,
a URL becomes a verified cache directory holding what the command needs (``cache.local_run``).
``coverage`` and ``site`` are extended here, around their own code: given a run URL (or
``--store``) they read the crowd's store - its certificates, checked as any, and its
ledger - and then run as they do on a local run.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import tempfile
import threading

import click

from open1b.cli import ERRORS, emit, fail
from open1b_train.recipe import Announcement


def run_url(run: str, need: str, step: int | None = None, from_step: int | None = None,
            mix: str | None = None, announce: Announcement = Announcement()):
    """``cache.local_run`` for a command (module docstring); a local path is returned as
    it is, so a command's behaviour on local runs does not change."""
    from open1b_audit.crowd.cache import local_run
    from open1b_audit.crowd.source import is_url

    if not is_url(run):
        from open1b_audit.crowd.cache import LocalRun

        return LocalRun(run, mix)
    try:
        return local_run(run, need, step, from_step, mix, announce,
                         os.environ.get("OPEN1B_RUN_CACHE"))
    except ERRORS as e:
        fail(e)


def _key_option(f):
    return click.option("--key", "key", type=click.Path(dir_okay=False), required=True,
                        help="Your Ed25519 key (open1b-audit keygen): it signs every "
                             "certificate and ledger event.")(f)


def _crowd_options(f):
    for opt in reversed([
        click.option("--store", default=None,
                     help="The crowd's shared place: s3://bucket/prefix or a local directory "
                          "(default: RUN_URL/audit)."),
        click.option("--cache", type=click.Path(file_okay=False), default=None,
                     help="Local cache (default: ~/.cache/open1b or $OPEN1B_CACHE)."),
        click.option("--mix", default=None,
                     help="Where the run's mix lies (default: what its run.json names, if it "
                          "is a place of the run URL's kind)."),
        click.option("--leg-steps", type=click.IntRange(min=1), default=4, show_default=True,
                     help="Steps per leg, when this auditor creates the plan."),
        click.option("--redundancy", type=click.IntRange(min=1), default=2, show_default=True,
                     help="Distinct keys that certify each leg, when creating the plan."),
        click.option("--lease", "lease_s", type=click.FloatRange(min=1), default=86400.0,
                     show_default=True,
                     help="Seconds an auditor may hold a leg, when creating the plan."),
        click.option("--heartbeat", "heartbeat_s", type=click.FloatRange(min=0.2),
                     default=300.0, show_default=True,
                     help="Seconds between a holder's renewals, when creating the plan (a "
                          "claim silent for three is expired)."),
    ]):
        f = opt(f)
    return f


@click.command("join")
@click.argument("run")
@_key_option
@_crowd_options
@click.option("--auditor", default=None, help="Your name in the certificates.")
@click.option("--max-legs", type=click.IntRange(min=1), default=None,
              help="Stop after this many legs.")
@click.option("--hours", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="Stop after this many hours (a leg that would end later ends 'timeout').")
@click.option("--backend", type=click.Choice(["cpu", "triton"]), default="cpu",
              show_default=True)
@click.option("--memory-plan", default="auto", show_default=True,
              metavar="auto|resident|lean|lean:N", help="As for replay.")
@click.option("--no-selftest", is_flag=True,
              help="Skip the doctor's selftest (its calibration still runs).")
@click.option("--poll", "poll_s", type=click.FloatRange(min=0.1), default=5.0,
              show_default=True, help="Seconds between looks at the store when idle.")
@click.option("--idle", "idle_s", type=click.FloatRange(min=0.0), default=600.0,
              show_default=True, help="Stop after this long without a leg to take.")
@click.option("--expect-run-hash", "expect", default=None, metavar="H",
              help="The run hash its owner published (pins the log).")
@click.option("--expect-preset", "expect_preset", default=None, metavar="NAME")
@click.option("--expect-mix", "expect_mix", default=None, metavar="FINGERPRINT")
@click.option("--json", "as_json", is_flag=True, help="The summary as JSON.")
def join_cmd(run, key, store, cache, mix, leg_steps, redundancy, lease_s, heartbeat_s,
             auditor, max_legs, hours, backend, memory_plan, no_selftest, poll_s, idle_s,
             expect, expect_preset, expect_mix, as_json) -> None:
    """Volunteer to audit RUN (a URL: s3://, http(s):// or a directory): doctor, claim a
    leg, fetch, replay, certify, hand off, publish - until stopped or nothing is left.
    Exit code: the worst outcome - 0 match, 1 mismatch, 4 timeout, 5 cancelled,
    6 inconclusive."""
    from open1b_audit.crowd.join import JoinOptions, join

    opts = JoinOptions(run=run, key_path=key, store=store, name=auditor, cache=cache, mix=mix,
                       announce=Announcement(_hex(expect), expect_preset, _hex(expect_mix)),
                       leg_steps=leg_steps, redundancy=redundancy, lease_s=lease_s,
                       heartbeat_s=heartbeat_s, max_legs=max_legs, hours=hours,
                       backend=backend, memory_plan=memory_plan, selftest=not no_selftest,
                       poll_s=poll_s, idle_s=idle_s)
    stop = threading.Event()

    def on_term(signum, frame):
        stop.set()
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGTERM, on_term)
    try:
        summ = join(opts, sys.stderr, stop)
    except ERRORS as e:
        fail(e)
    finally:
        signal.signal(signal.SIGTERM, old)
    rep = summ.to_dict()

    def human(r):
        by = {}
        for x in r["legs"]:
            by[x["outcome"]] = by.get(x["outcome"], 0) + 1
        click.echo(f"legs: {len(r['legs'])} ({', '.join(f'{k} {v}' for k, v in by.items()) or 'none'})"
                   f"; steps certified: {len(r['steps_certified'])}; claims lost to others: "
                   f"{r['claims_lost']}; {r['seconds']:.1f} s; stopped: {r['stopped']}")
        f = r["bytes_fetched"]
        per = r["bytes_fetched_per_step"]
        click.echo(f"fetched {f.get('total', 0):,} bytes ("
                   + ", ".join(f"{k} {v:,}" for k, v in f.items() if k != "total")
                   + ")" + (f", {per:,} per certified step" if per else ""))
        s = r["store"]
        click.echo(f"wrote {s.get('objects_created', 0)} objects, "
                   f"{s.get('bytes_written', 0):,} bytes ("
                   + ", ".join(f"{k} {v}" for k, v in s.get("objects_by_kind", {}).items())
                   + f"); {s.get('retries', 0)} store retries")
        click.echo(f"outcome: {r['outcome'].upper()}")
    emit(rep, as_json, human)
    sys.exit(rep["exit_code"])


def _hex(x: str | None) -> str | None:
    return None if x is None else x.lower()


@click.command("doctor")
@click.argument("run")
@click.option("--store", default=None, help="The crowd's store (its plan's leg length and "
                                            "lease; default RUN_URL/audit).")
@click.option("--cache", type=click.Path(file_okay=False), default=None)
@click.option("--mix", default=None)
@click.option("--leg-steps", type=click.IntRange(min=1), default=4, show_default=True,
              help="Without a plan in the store: the leg length to check.")
@click.option("--lease", "lease_s", type=click.FloatRange(min=1), default=86400.0,
              show_default=True, help="Without a plan in the store: the lease to check.")
@click.option("--refresh", is_flag=True, help="Run the selftest even if a recent one passed.")
@click.option("--json", "as_json", is_flag=True)
def doctor_cmd(run, store, cache, mix, leg_steps, lease_s, refresh, as_json) -> None:
    """Can this machine take a leg of RUN? The selftest, a short measured calibration on the
    run's model (time per window and per step, peak memory, disk), and whether a leg ends
    within the crowd's lease; exits 1 when it cannot."""
    from open1b_audit.crowd.cache import RunCache, default_root
    from open1b_audit.crowd.doctor import doctor
    from open1b_audit.crowd.join import store_url
    from open1b_audit.crowd.plan import NAME, parse
    from open1b_audit.crowd.source import RunSource
    from open1b_audit.crowd.store import Store

    try:
        numbers = {"leg_steps": leg_steps, "lease_s": lease_s}
        with contextlib.suppress(FileNotFoundError, ValueError):
            s = Store(store_url(run, store), patience=10)
            p = parse(s.read(NAME), NAME)
            numbers = {"leg_steps": p.leg_steps, "lease_s": p.lease_s}
        rc = RunCache(RunSource(run), os.path.join(cache or default_root(run), "doctor"),
                      mix=mix)
        rep = doctor(rc, numbers, refresh_selftest=refresh)
    except ERRORS as e:
        fail(e)

    def human(r):
        st = r.get("selftest") or {}
        click.echo(f"selftest: {st.get('verdict')} ({st.get('seconds')} s"
                   f"{', kept from an earlier run' if st.get('cached') else ''})")
        c, s, leg = r["calibration"], r["step"], r["leg"]
        click.echo(f"calibration: a window forward+backward {s['per_window_s']:.3f} s (LM head "
                   f"{c['head_s']:.3f} s, windowed layer {c['windowed_layer_s']:.3f} s, full "
                   f"layer {c['full_layer_s']:.3f} s), update + hashes {c['update_s']:.3f} s")
        click.echo(f"step: {s['windows']} windows, about {s['seconds']:.1f} s; leg of "
                   f"{leg['steps']} step(s): about {leg['seconds']:.1f} s, lease "
                   f"{leg['lease_s']:.0f} s: {'fits' if leg['fits'] else 'DOES NOT FIT'}")
        m = r["memory"]
        click.echo(f"memory: {m['text']}: {'fits' if m['fits'] else 'DOES NOT FIT'}")
        d = r["disk"]
        click.echo(f"disk: {d['needed_bytes'] / 2**20:.1f} MiB needed, "
                   f"{d['free_bytes'] / 2**30:.1f} GiB free: "
                   f"{'fits' if d['fits'] else 'DOES NOT FIT'}")
        click.echo("verdict: " + ("this machine can join" if r["ok"] else
                                  "REFUSED: " + "; ".join(r["reasons"])))
    emit(rep, as_json, human)
    if not rep["ok"]:
        sys.exit(1)


@click.command("publish")
@click.argument("run", type=click.Path(file_okay=False, exists=True))
@click.argument("url")
@click.option("--mix-url", required=True,
              help="Where auditors find the mix (a URL, or a path relative to URL such as "
                   "../mix); written into the published run.json.")
@click.option("--mix", "mix_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Also upload this built mix to --mix-url.")
@click.option("--json", "as_json", is_flag=True)
def publish_cmd(run, url, mix_url, mix_dir, as_json) -> None:
    """Upload RUN (and its mix) to URL, where a crowd of auditors reads it."""
    from open1b_audit.crowd.publish import publish

    try:
        rep = publish(run, url, mix_url, mix_dir)
    except ERRORS as e:
        fail(e)
    emit(rep, as_json, lambda r: click.echo(f"published {run} to {url}: {r['files']} files, "
                                            f"{r['bytes']:,} bytes; mix at {r['mix']}"))


# ---------------------------------------------------------------------------- coverage, site

def _store_for(run: str, store: str | None):
    from open1b_audit.crowd.join import store_url
    from open1b_audit.crowd.source import is_url
    from open1b_audit.crowd.store import Store

    if store is None and not is_url(run):
        return None
    return Store(store_url(run, store), patience=30)


def extend_coverage(cmd: click.Command) -> None:
    """``coverage RUN_URL --trusted-keys F``: the crowd's store (module docstring)."""
    original = cmd.callback
    cmd.params.append(click.Option(["--store"], default=None,
                                   help="Read the certificates and ledger of the crowd's "
                                        "store (default for a run URL: RUN_URL/audit)."))
    for p in cmd.params:
        if p.name == "certs":
            p.required = False
    cmd.help = (cmd.help or "") + (" RUN may be a URL (s3://, http(s)://): then, or with "
                                   "--store, the crowd's store is read - legs in flight, "
                                   "expired claims, disputes, distrusted keys.")

    def callback(**kw):
        store_arg = kw.pop("store")
        run = kw["run"]
        st = _store_for(run, store_arg)
        if st is None:
            if not kw["certs"]:
                raise click.UsageError("give certificate folders (CERTS), or --store")
            return original(**kw)
        return _crowd_coverage(original, st, kw)
    cmd.callback = callback


def _report(st, run: str, lr, announce: Announcement, redundancy: int, trusted):
    """The crowd report of ``st`` for ``run`` (a URL's cache, or a local run read through a
    cache of its own) and the folder of the certificates it counts."""
    from open1b_audit.crowd.cache import RunCache, default_root
    from open1b_audit.crowd.report import crowd_report
    from open1b_audit.crowd.source import RunSource

    rc = lr.cache if lr is not None and lr.cache is not None else RunCache(
        RunSource(run), os.path.join(default_root(run), "report"), announce)
    with tempfile.TemporaryDirectory() as work:
        rep = crowd_report(st, rc, redundancy, trusted, announce, None, work)
    folder = os.path.join(rc.root, "store-certs")
    _write_counted(st, rep, folder)
    return rep, folder


def _crowd_coverage(original, st, kw) -> None:
    from open1b_audit import certificate
    from open1b_audit.crowd.source import is_url

    run = kw["run"]
    announce = Announcement(kw["expect"], kw["expect_preset"], kw["expect_mix"])
    lr = run_url(run, "released", announce=announce) if is_url(run) else None
    try:
        trusted = None
        if kw["trusted_keys"]:
            trusted = certificate.read_trusted_keys(kw["trusted_keys"])
        rep, folder = _report(st, run, lr, announce, kw["redundancy"], trusted)
    except ERRORS as e:
        fail(e)
    crowd = rep["crowd"]
    kw = {**kw, "run": lr.dir if lr is not None else run,
          "certs": tuple(kw["certs"] or ()) + (folder,)}
    buf = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(buf):
        try:
            original(**kw)
        except SystemExit as e:
            code = e.code or 0
    text = buf.getvalue()
    if kw["as_json"]:
        try:
            out = json.loads(text)
        except ValueError:
            out = {"coverage": text}
        out["crowd"] = crowd
        click.echo(json.dumps(out, indent=1, default=str))
    else:
        click.echo(text, nl=False)
        _crowd_human(crowd)
    bad = crowd["distrusted"] or crowd["forged_events"] or crowd["disputes"]
    sys.exit(code or (1 if bad else 0))


def _write_counted(st, rep, folder: str) -> None:
    """The store's certificates that coverage reads, as a folder: those of distrusted keys
    that would otherwise count are left out (``report.py``)."""
    import shutil

    from open1b_audit.crowd.report import write_certificates

    shutil.rmtree(folder, ignore_errors=True)
    skip = {x["certificate"].split(st.url + "/", 1)[-1] for x in rep["crowd"]["not_counted"]}
    write_certificates(st, folder, skip)


def _crowd_human(c: dict) -> None:
    p = c["plan"]
    click.echo(f"crowd at {c['store']}: {c['legs_covered']} of {len(c['legs'])} legs certified "
               f"by {p['redundancy']} distinct key(s) (legs of <= {p['leg_steps']} steps)")
    for x in c["in_flight"]:
        click.echo(f"  in flight: leg {x['leg']} slot {x['slot']} by {str(x['key'])[:16]}")
    for x in c["expired"]:
        click.echo(f"  expired claim: leg {x['leg']} slot {x['slot']} by {str(x['key'])[:16]} "
                   f"(its auditor stopped renewing; the slot is open again)")
    for d in c["disputes"]:
        f = d.get("finding") or {}
        click.echo(f"  DISPUTE leg {d['leg']} by {d['key'][:16]}: step {f.get('step')} "
                   f"{f.get('component')}: {f.get('detail')} (evidence {d.get('evidence')})")
    for r in c["refusals"]:
        click.echo(f"  refused hand-off of step {r['step']} by {r['sender'][:16]} "
                   f"({'confirmed' if r['confirmed'] else 'NOT confirmed'}): {r['why']}")
    for k, why in c["distrusted"].items():
        click.echo(f"  DISTRUSTED key {k[:16]}: none of its certificates counts - "
                   + "; ".join(why))
    for e in c["forged_events"]:
        click.echo(f"  FORGED ledger object {e['object']}: {e['why']}")


def extend_site(cmd: click.Command) -> None:
    """``site RUN_URL``: the run from its cache, the mix where it lies, the store's
    certificates, and a crowd page (``crowd.html``)."""
    original = cmd.callback
    cmd.params.append(click.Option(["--store"], default=None,
                                   help="Show the crowd's store (default for a run URL: "
                                        "RUN_URL/audit)."))
    cmd.help = (cmd.help or "") + " RUN may be a URL (s3://, http(s)://)."

    def callback(**kw):
        from open1b_audit.crowd.page import write_crowd_page

        store_arg = kw.pop("store")
        run = kw["run"]
        st = _store_for(run, store_arg)
        if st is None:
            return original(**kw)
        lr = run_url(run, "config", mix=kw.get("mix"))
        rep = None
        try:
            if st.exists("plan.json"):
                rep, kw["certs"] = _report(st, run, lr, Announcement(), 1, None)
        except ERRORS as e:
            fail(e)
        kw.update(run=lr.dir, mix=kw.get("mix") or lr.mix)
        original(**kw)
        if rep is not None:
            click.echo(f"wrote {write_crowd_page(rep, kw['out'])} (the crowd)")
    cmd.callback = callback


def register(main: click.Group) -> None:
    """Add the crowd's commands to ``open1b-audit`` and extend coverage and site."""
    for c in (join_cmd, doctor_cmd, publish_cmd):
        main.add_command(c)
    if "coverage" in main.commands:
        extend_coverage(main.commands["coverage"])
    if "site" in main.commands:
        extend_site(main.commands["site"])
