"""``open1b-audit``: the thin click layer over ``open1b_audit``.

Every command prints a human table by default and one JSON object with ``--json``. A check
that finds a difference exits with status 1 after reporting it; errors (bad arguments,
unreadable files) exit 1 with one line, usage errors 2; never a traceback.
"""
from __future__ import annotations

import json
import os
import sys

import click

from open1b_audit import __version__
from open1b_data.cli.stream import STEPS
from open1b_data.errors import Open1bDataError
from open1b_train.errors import Open1bTrainError

ERRORS = (Open1bTrainError, Open1bDataError, ValueError, OSError)


def _fail(e: Exception) -> None:
    raise click.ClickException(str(e)) from None


def _emit(obj, as_json: bool, human) -> None:
    if as_json:
        click.echo(json.dumps(obj, indent=1, default=str))
    else:
        human(obj)


def _steps_of(run: str) -> list[dict]:
    from open1b_train import runlog

    lines = runlog.read(run, strict=False)
    if not lines:
        raise click.ClickException(f"{run}: no steps.jsonl (not a run directory?)")
    return lines


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="open1b-audit")
def main() -> None:
    """Check a published Open-1B run step by step on this machine (docs/AUDIT.md)."""


@main.command("chain")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def chain_cmd(run, as_json) -> None:
    """Is RUN/steps.jsonl one unbroken hash chain? (No re-execution; seconds.)"""
    from open1b_audit import chain

    try:
        lines = _steps_of(run)
        f = chain.check(lines)
    except ERRORS as e:
        _fail(e)
    rep = {"run": run, "steps": len(lines) - 1, "run_hash": lines[-1]["hash"],
           "finding": None if f is None else f.to_dict()}
    _emit(rep, as_json, lambda r: click.echo(
        f"{run}: {r['steps']} steps, run hash {r['run_hash']}\n"
        + ("chain OK" if f is None else f"BROKEN at {f}")))
    if f is not None:
        sys.exit(1)


@main.command("replay")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--step", type=click.IntRange(min=1), required=True,
              help="Replay up to this step (from the nearest checkpoint before it).")
@click.option("--mix", default=None, help="The built mix (default: the one the run names).")
@click.option("--backend", type=click.Choice(["cpu", "triton"]), default="cpu",
              show_default=True, help="CPU reference or Triton kernels (CUDA or interpreter).")
@click.option("--from-step", type=click.IntRange(min=0), default=None,
              help="Start from this checkpoint instead of the nearest one.")
@click.option("--spill", type=click.Path(file_okay=False), default=None,
              help="Directory for dormant TreeFold partials (bounded memory).")
@click.option("--certify", type=click.Path(file_okay=False), default=None,
              help="Write a certificate per replayed step into this directory.")
@click.option("--key", type=click.Path(dir_okay=False), default=None,
              help="Sign the certificates with this Ed25519 key (open1b-audit keygen).")
@click.option("--auditor", default=None, help="Your name in the certificates.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def replay_cmd(run, step, mix, backend, from_step, spill, certify, key, auditor,
               as_json) -> None:
    """Re-execute steps of RUN and compare every component digest with its log; exits 1
    naming the first step and component that differ."""
    from open1b_audit import certificate
    from open1b_audit.replay import machine, replay

    if key and not certify:
        raise click.UsageError("--key signs certificates: give --certify DIR too")
    try:
        res = replay(run, step, mix, backend, spill, from_step)
        written = []
        if certify:
            lines = _steps_of(run)
            os.makedirs(certify, exist_ok=True)
            who = auditor or os.environ.get("USER", "auditor")
            for s in sorted(set(res.verified) | ({res.finding.step} if res.finding and
                                                  res.finding.step > res.start else set())):
                cert = certificate.build(lines, s, res.lines.get(s),
                                         res.finding if s not in res.verified else None,
                                         who, backend, machine(), res.start)
                if key:
                    cert = certificate.sign(cert, key)
                path = os.path.join(certify, f"step-{s:08d}.json")
                certificate.write(cert, path)
                written.append(path)
    except ERRORS as e:
        _fail(e)
    rep = {**res.to_dict(), "certificates": written}

    def human(r):
        click.echo(f"replay of {run} steps {r['replayed_from'] + 1}..{step} on {r['device']} "
                   f"({backend}), from checkpoint {r['replayed_from']}")
        for s in r["verified_steps"]:
            click.echo(f"  step {s:>6}  match   {r['step_seconds'][s]:.2f} s")
        if r["finding"]:
            f = r["finding"]
            click.echo(f"  step {f['step']:>6}  MISMATCH  {f['component']}: {f['detail']}")
        click.echo(f"verdict: {r['verdict'].upper()}  time {r['seconds']:.1f} s, peak memory "
                   f"{r['peak_memory_bytes'] / 2**20:.0f} MiB, TreeFold partials <= "
                   f"{r['treefold_peak_partials']}")
        for p in r["certificates"]:
            click.echo(f"  wrote {p}")
    _emit(rep, as_json, human)
    if not res.ok:
        sys.exit(1)


@main.command("trace")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--step", type=click.IntRange(min=1), required=True, help="The step to trace.")
@click.option("--out", required=True, help="Trace file (JSON lines).")
@click.option("--mix", default=None, help="The built mix (default: the one the run names).")
@click.option("--backend", type=click.Choice(["cpu", "triton"]), default="cpu",
              show_default=True)
def trace_cmd(run, step, out, mix, backend) -> None:
    """Replay STEP of RUN with a digest of every op's output (for bisect --against)."""
    from open1b_audit.bisect import trace_step

    try:
        t = trace_step(run, step, out, mix=mix, backend=backend)
    except ERRORS as e:
        _fail(e)
    click.echo(f"wrote {out}: {len(t.ops)} ops of step {step} "
               f"({'replay matches the log' if t.replay.ok else 'replay DIFFERS from the log'})")


@main.command("bisect")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--until", type=click.IntRange(min=1), required=True,
              help="Search steps 1..UNTIL for the first that does not reproduce.")
@click.option("--against", type=click.Path(dir_okay=False), default=None,
              help="The other party's trace of that step (default RUN/traces/step-N.jsonl).")
@click.option("--mix", default=None, help="The built mix (default: the one the run names).")
@click.option("--backend", type=click.Choice(["cpu", "triton"]), default="cpu",
              show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def bisect_cmd(run, until, against, mix, backend, as_json) -> None:
    """The first step whose replay differs from RUN's log, then its first differing op."""
    from open1b_audit.bisect import bisect

    try:
        rep = bisect(run, until, against, mix=mix, backend=backend)
    except ERRORS as e:
        _fail(e)

    def human(r):
        if r["step"] is None:
            click.echo(f"steps 1..{until} of {run} all reproduce: nothing to bisect")
            return
        f = r["finding"]
        click.echo(f"first differing step: {r['step']} ({f['component']}: {f['detail']})")
        op = r["operator"]
        if op:
            click.echo(f"first differing operator: {op['name']} (virtual rank {op['rank']}, "
                       f"micro-batch {op['mb']}, layer {op['layer']}, {op['dir']}, op "
                       f"{op['op']}) - {op['why']}")
        elif r.get("operator_unavailable"):
            click.echo(r["operator_unavailable"])
        else:
            click.echo("the traces of that step are identical op for op")
    _emit(rep, as_json, human)
    if rep["step"] is not None:
        sys.exit(1)


@main.command("keygen")
@click.argument("key", type=click.Path(dir_okay=False))
def keygen_cmd(key) -> None:
    """Make an Ed25519 key for signing certificates (KEY and KEY.pub)."""
    from open1b_audit import certificate

    try:
        pub = certificate.keygen(key)
    except ERRORS as e:
        _fail(e)
    click.echo(f"wrote {key} (private, mode 600) and {key}.pub; public key {pub}")


@main.command("assign")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--auditors", type=click.IntRange(min=1), required=True, help="K auditors.")
@click.option("--redundancy", type=click.IntRange(min=1), default=1, show_default=True,
              help="Distinct auditors per step.")
@click.option("--seed", type=int, required=True, help="The assignment seed (publish it).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def assign_cmd(run, auditors, redundancy, seed, as_json) -> None:
    """Which steps each of K auditors replays so every step is covered r times."""
    from open1b_audit.assign import assign

    try:
        steps = list(range(1, len(_steps_of(run))))
        a = assign(steps, auditors, redundancy, seed)
    except ERRORS as e:
        _fail(e)
    rep = {"run": run, "steps": len(steps), "auditors": auditors, "redundancy": redundancy,
           "seed": seed, "assignment": {str(k): v for k, v in a.items()}}
    _emit(rep, as_json, lambda r: [click.echo(f"auditor {k:>4}: {len(v)} steps: "
                                              f"{', '.join(map(str, v[:12]))}"
                                              f"{' ...' if len(v) > 12 else ''}")
                                   for k, v in a.items()])


@main.command("coverage")
@click.argument("run", type=click.Path(file_okay=False))
@click.argument("certs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--redundancy", type=click.IntRange(min=1), default=1, show_default=True,
              help="Distinct auditors a step needs to count as covered.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def coverage_cmd(run, certs, redundancy, as_json) -> None:
    """Which steps of RUN the certificates cover, the gaps, and any conflict (exit 1)."""
    from open1b_audit import certificate
    from open1b_audit.coverage import coverage

    paths = []
    for c in certs:
        if os.path.isdir(c):
            paths.extend(sorted(os.path.join(c, n) for n in os.listdir(c) if n.endswith(".json")))
        else:
            paths.append(c)
    try:
        rep = coverage(_steps_of(run), [(p, certificate.read(p)) for p in paths], redundancy)
    except ERRORS as e:
        _fail(e)

    def human(r):
        click.echo(f"{run}: {r['covered']} of {r['steps']} steps certified by >= "
                   f"{redundancy} distinct auditor(s); run hash {r['run_hash'][:16]}...")
        if r["gaps"]:
            g = r["gaps"]
            click.echo(f"gaps ({len(g)}): {', '.join(map(str, g[:20]))}{' ...' if len(g) > 20 else ''}")
        for c in r["conflicts"]:
            click.echo(f"CONFLICT step {c['step']}: {c['certificate']}: {c['why']}")
    _emit(rep, as_json, human)
    if rep["conflicts"]:
        sys.exit(1)


@main.command("fetch-step")
@click.argument("mix_url")
@click.option("--step", type=click.IntRange(min=1), required=True,
              help="The training step whose windows to fetch (from 1).")
@click.option("--out", default=None,
              help="Also write DIR/windows.npy (uint32 windows x tokens) and DIR/step.json "
                   "(this report with every document, its tokens and its proof).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def fetch_step_cmd(mix_url, step, out, as_json) -> None:
    """Fetch only the documents STEP of a run trained on from the mix at MIX_URL, prove
    each against its shard's Merkle root, and rebuild the step's windows and data digest;
    exits 1 naming a document that fails its proof, with nothing reported as verified."""
    from open1b_audit.fetch import fetch_step, write_step

    try:
        data = fetch_step(mix_url, step)
        written = write_step(data, out) if out else []
    except ERRORS as e:
        _fail(e)
    rep = {**data.to_dict(), "written": written}

    def human(r):
        n = len(r["windows"])
        click.echo(f"mix {r['name']}  fingerprint {r['fingerprint'][:16]}... (recomputed "
                   f"from manifest.json)")
        click.echo(f"step {step}: windows {r['windows'][0]['window']}.."
                   f"{r['windows'][-1]['window']} ({n} x {r['window_tokens']} tokens)")
        for w in r["windows"][:8]:
            click.echo(f"  window {w['window']:>9}  sha256 {w['sha256']}")
        if n > 8:
            click.echo(f"  ... {n - 8} more (--json lists all)")
        click.echo(f"data digest  {r['data_digest']}")
        click.echo(f"             (compare with step {step}'s components.data in the run's "
                   f"steps.jsonl)")
        click.echo(f"documents    {r['documents']} from {r['shards']} shard(s), each proved "
                   f"against its shard's Merkle root")
        b = r["bytes_fetched"]
        parts = ", ".join(f"{k} {v:,}" for k, v in b.items() if k != "total")
        share = "" if r["fraction"] is None else f" = {r['fraction']:.2%} of"
        click.echo(f"fetched      {b['total']:,} bytes in {r['requests']} requests{share} "
                   f"the mix's {r['mix_bytes']:,} token shard bytes ({parts})")
        for p in r["written"]:
            click.echo(f"  wrote {p}")
    _emit(rep, as_json, human)


@main.command("site")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--mix", default=None, help="The built mix (default: the one the run names).")
@click.option("--certs", type=click.Path(file_okay=False), default=None,
              help="A directory of certificates (*.json) for coverage and step pages.")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Directory to write the static site into (open OUT/index.html).")
@click.option("--steps", "steps", type=STEPS, default=None,
              help="Write step pages for steps A..B (default: the first 64 and every "
                   "certified step).")
@click.option("--build-index", is_flag=True,
              help="Build the mix's seek index first if it is missing (far steps).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def site_cmd(run, mix, certs, out, steps, build_index, as_json) -> None:
    """Write the run explorer of RUN as a static site: run, step, document, coverage and
    mix pages (docs/AUDIT.md, "The run explorer")."""
    from open1b_audit.site.data import Explorer
    from open1b_audit.site.static import write_site

    try:
        ex = Explorer.open(run, mix, certs, build_index)
        rep = write_site(ex, out, None if steps is None else list(range(steps[0], steps[1] + 1)))
    except ERRORS as e:
        _fail(e)
    _emit(rep, as_json, lambda r: click.echo(
        f"wrote {r['out']}: {r['files']} files, {r['bytes'] / 2**20:.1f} MiB ({len(r['steps'])} "
        f"step pages, {r['documents']} document pages; largest {r['largest']['file']} "
        f"{r['largest']['bytes'] / 2**10:.0f} KiB) in {r['seconds']:.1f} s\n"
        f"open {os.path.join(r['out'], 'index.html')}"))


@main.command("serve")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--mix", default=None, help="The built mix (default: the one the run names).")
@click.option("--certs", type=click.Path(file_okay=False), default=None,
              help="A directory of certificates (*.json) for coverage and step pages.")
@click.option("--port", type=click.IntRange(0, 65535), default=8017, show_default=True,
              help="Port on 127.0.0.1 (0: any free port).")
@click.option("--build-index", is_flag=True,
              help="Build the mix's seek index first if it is missing (far steps).")
def serve_cmd(run, mix, certs, port, build_index) -> None:
    """Serve the run explorer of RUN on 127.0.0.1, every page rendered on demand (any
    step of a large run); Ctrl-C stops it."""
    from open1b_audit.site.data import Explorer
    from open1b_audit.site.serve import make_server

    try:
        ex = Explorer.open(run, mix, certs, build_index)
        server = make_server(ex, port)
    except ERRORS as e:
        _fail(e)
    host, bound = server.server_address[:2]
    click.echo(f"serving {run} ({ex.last} steps) at http://{host}:{bound}/ - Ctrl-C stops")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
