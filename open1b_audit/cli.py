"""``open1b-audit``: the thin click layer over ``open1b_audit``.

Every command prints a human table by default and one JSON object with ``--json``. A check
that finds a difference exits with status 1 after reporting it; errors (bad arguments,
unreadable files) exit 1 with one line, usage errors 2; never a traceback.
"""
from __future__ import annotations

import os
import sys

import click

from open1b.cli import ERRORS, Cli, emit, fail
from open1b_audit import __version__
from open1b_audit.options import announcement, expect_recipe, expect_run_hash, recipe_lines
from open1b_audit.pinned import chained, cut_note, log_of
from open1b_train.cli import check_memory_plan


def _run_url(run: str, need: str, **kw):
    """RUN as a local directory: a run URL (s3://, http(s)://) becomes a verified cache of
    what the command needs (``open1b_audit.crowd.cli.run_url``)."""
    from open1b_audit.crowd.cli import run_url

    return run_url(run, need, **kw)


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="open1b-audit")
def main() -> None:
    """Check a published Open-1B run step by step on this machine (docs/AUDIT.md)."""


@main.command("selftest")
@click.option("--steps", type=click.IntRange(1, 3), default=3, show_default=True,
              help="Steps of the golden micro trajectory to replay on each backend.")
@click.option("--interpreter", is_flag=True,
              help="Also run the Triton kernels under the interpreter (needs triton; slow).")
@click.option("--work", type=click.Path(file_okay=False), default=None,
              help="Directory for the temporary mix and runs (default: the system's).")
@click.option("--json", "as_json", is_flag=True,
              help="The whole report (machine description included), for a certificate.")
def selftest_cmd(steps, interpreter, work, as_json) -> None:
    """Does this machine compute the runtime's bits? Re-derives the demo preset's initial
    weights, replays the committed golden trajectory's first steps on every backend here,
    names the first differing step, component and operator. Run it first (minutes)."""
    from open1b_audit.selftest import run_selftest

    try:
        rep = run_selftest(steps=steps, interpreter=interpreter, work=work)
    except ERRORS as e:
        fail(e)

    def human(r):
        m = r["machine"]
        cpu = m["cpu"]
        products = ("on AMX tiles" if m.get("attention_tiles") else
                    "partly on VNNI" if m.get("attention_vnni") else "float")
        click.echo(f"machine: {cpu['arch']} {cpu['model']} ({cpu['cores']} cores), torch "
                   f"{m['torch']} (CPU capability {m['torch_cpu_capability']}), numpy "
                   f"{m['numpy']}, python {m['python']}, C math extension "
                   f"{'on' if m['mathc'] else 'off'}, attention loops "
                   f"{'on' if m.get('attention_loops') else 'off'} (products "
                   f"{products}), "
                   f"FTZ {'ON' if m['flush']['ftz'] else 'off'}"
                   f", DAZ {'ON' if m['flush']['daz'] else 'off'}"
                   + (f", GPU {m['cuda']}" if m["cuda"] else ""))
        for module, why in (m.get("mathc_errors") or {}).items():
            click.echo(f"C math extension {module} missing: {why} - the torch definitions run "
                       "instead (the same bits, slower); reinstall where a C compiler builds it")
        g = m["int_gemm"]
        click.echo(f"integer GEMM: {g['route']} route ({g['reason']}; "
                   f"{g['failures']} failed checksum(s))")
        click.echo(f"cpu flags: {' '.join(cpu['flags'])}")
        for c in r["checks"]:
            what = c["check"] + (f" [{c['backend']}]" if "backend" in c else "")
            line = f"  {what:<42} {c['verdict']}"
            d = c.get("difference")
            if d:
                line += f": step {d['step']} {d['component']} differs"
            if c.get("operator"):
                line += f", first at op {c['operator'].get('name')} ({c['operator']['why']})"
            if c.get("error"):
                line += f": {c['error']}"
            if c["verdict"] == "MISMATCH" and "expected" in c:
                line += f": expected {c['expected'][:16]}..., got {c['got'][:16]}..."
            click.echo(line)
        click.echo(f"verdict: {r['verdict']} ({r['seconds']} s)")
    emit(rep, as_json, human)
    if not rep["ok"]:
        sys.exit(1)


@main.command("chain")
@click.argument("run", type=click.Path(file_okay=False))
@expect_run_hash
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def chain_cmd(run, expect, as_json) -> None:
    """Is RUN/steps.jsonl one unbroken hash chain? (No re-execution; seconds.) A cut-off
    last line is a finding; compare the run hash with the published one (--expect-run-hash)."""
    from open1b_train import chain

    run = _run_url(run, "log").dir
    try:
        log = log_of(run, expect)
        lines = log.lines
        f = chain.check(lines) or chain.cut_tail(lines, log.partial_bytes)
    except ERRORS as e:
        fail(e)
    rep = {"run": run, "steps": len(lines) - 1, "run_hash": lines[-1].get("hash"),
           "expected_run_hash": expect, "partial_tail_bytes": log.partial_bytes,
           "finding": None if f is None else f.to_dict()}
    emit(rep, as_json, lambda r: click.echo(
        f"{run}: {r['steps']} steps, run hash {r['run_hash']}"
        + (" (the published one)" if expect else "") + "\n"
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
@click.option("--memory-plan", default="auto", callback=check_memory_plan, show_default=True,
              metavar="auto|resident|lean|lean:N",
              help="How the replay holds the state (the bits are the same): resident, lean "
                   "(Adam moments in files under RUN/memplan streamed in chunks, activations "
                   "recomputed except for as many layers as MemAvailable holds, the LM head "
                   "in token blocks, TreeFold partials spilled), lean:N (exactly N layers' "
                   "activations kept; lean:0 recomputes all), auto (lean when the resident "
                   "plan's estimated peak exceeds MemAvailable).")
@click.option("--certify", type=click.Path(file_okay=False), default=None,
              help="Write a certificate per replayed step into this directory.")
@click.option("--key", type=click.Path(dir_okay=False), default=None,
              help="Sign the certificates with this Ed25519 key (open1b-audit keygen).")
@click.option("--auditor", default=None, help="Your name in the certificates.")
@expect_run_hash
@expect_recipe
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def replay_cmd(run, step, mix, backend, from_step, spill, memory_plan, certify, key, auditor,
               expect, expect_preset, expect_mix, as_json) -> None:
    """Re-execute steps of RUN and compare every component digest with its log; exits 1
    naming the first step and component that differ."""
    from open1b_audit import certificate
    from open1b_audit.replay import machine, replay

    if key and not certify:
        raise click.UsageError("--key signs certificates: give --certify DIR too")
    announce = announcement(expect, expect_preset, expect_mix)
    src = _run_url(run, "replay", step=step, from_step=from_step, mix=mix, announce=announce)
    run, mix = src.dir, src.mix
    try:
        log = log_of(run, expect)
        res = replay(run, step, mix, backend, spill, from_step, memory_plan=memory_plan,
                     announce=announce, windows=src.windows)
        written = []
        if certify:
            lines = log.lines
            os.makedirs(certify, exist_ok=True)
            who = auditor or os.environ.get("USER", "auditor")
            for s in sorted(set(res.verified) | ({res.finding.step} if res.finding and
                                                  res.finding.step > res.start else set())):
                cert = certificate.build(lines, s, res.lines.get(s),
                                         res.finding if s not in res.verified else None,
                                         who, backend, machine(), res.start, res.recipe,
                                         s in res.checkpoints_compared)
                if key:
                    cert = certificate.sign(cert, key)
                path = certificate.path_for(certify, s, cert)
                certificate.write(cert, path)
                written.append(path)
    except ERRORS as e:
        fail(e)
    rep = {**res.to_dict(), "certificates": written, "expected_run_hash": expect,
           "partial_tail_bytes": log.partial_bytes, "bytes_fetched": src.fetched()}

    def human(r):
        click.echo(f"replay of {run} steps {r['replayed_from'] + 1}..{step} on {r['device']} "
                   f"({backend}), from checkpoint {r['replayed_from']}, {r['memory_plan_text']}")
        for s in r["verified_steps"]:
            click.echo(f"  step {s:>6}  match   {r['step_seconds'][s]:.2f} s")
        if r["finding"]:
            f = r["finding"]
            click.echo(f"  step {f['step']:>6}  MISMATCH  {f['component']}: {f['detail']}")
        click.echo(f"verdict: {r['verdict'].upper()}  time {r['seconds']:.1f} s, peak memory "
                   f"{r['peak_memory_bytes'] / 2**20:.0f} MiB, TreeFold partials <= "
                   f"{r['treefold_peak_partials']}")
        for line in recipe_lines(r.get("recipe"), announce):
            click.echo(line)
        if r["checkpoints_compared"]:
            click.echo(f"published checkpoints compared with the replayed state: steps "
                       f"{', '.join(map(str, r['checkpoints_compared']))}")
        for p in r["certificates"]:
            click.echo(f"  wrote {p}")
        if r["bytes_fetched"]:
            b = r["bytes_fetched"]
            click.echo(f"fetched {b['total']:,} bytes (" + ", ".join(
                f"{k} {v:,}" for k, v in b.items() if k != "total") + ")")
    emit(rep, as_json, human)
    if cut_note(log) and not as_json:
        click.echo(cut_note(log))
    if not res.ok:
        sys.exit(1)


@main.command("verify-model")
@click.argument("model_dir", type=click.Path(file_okay=False))
@click.option("--run", "run", type=click.Path(file_okay=False), required=True,
              help="The published run the model claims to come from (a directory or URL).")
@click.option("--mix", default=None, help="The run's built mix (default: the one it names).")
@expect_run_hash
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def verify_model_cmd(model_dir, run, mix, expect, as_json) -> None:
    """Is MODEL_DIR (a checkpoint directory, or a folder written by `open1b-train export` as
    downloaded from a model hub) step N of RUN? Names the first differing tensor, config
    field, tokenizer file or provenance field; exits 1 unless it is a step of the run."""
    from open1b_eval.verify import verify_model
    from open1b_train.published import open_published
    from open1b_train.recipe import Announcement

    src = _run_url(run, "model", mix=mix, announce=Announcement(run_hash=expect))
    run, mix = src.dir, src.mix
    try:
        pub = open_published(run, mix, Announcement(run_hash=expect))
        v = verify_model(model_dir, pub)
    except ERRORS as e:
        fail(e)
    rep = {**v.to_dict(), "notes": pub.notes}

    def human(r):
        for n in r["notes"]:
            click.echo(f"note: {n}")
        for c in r["checked"]:
            click.echo(f"  checked {c}")
        if v.ok:
            click.echo(f"{model_dir} is step {r['step']} of run {r['run_hash']}"
                       + (" (the published run hash)" if expect else
                          " (run hash NOT pinned: pass --expect-run-hash)"))
        else:
            d = r["difference"] or {}
            click.echo(f"DIFFERS: {d.get('what')} {d.get('name')}: {d.get('detail')}")
    emit(rep, as_json, human)
    if not v.ok:
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
        fail(e)
    if not t.ops:                       # the replay stopped before the step (a broken log)
        fail(ValueError(f"step {step} of {run} was not replayed, nothing traced: "
                         f"{t.replay.finding}"))
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
@click.option("--search", type=click.Choice(["all", "binary"]), default="all",
              show_default=True,
              help="all: replay every checkpoint interval (vouches for 1..UNTIL); binary: "
                   "sample O(log n) intervals - never vouches, names what it skipped.")
@expect_run_hash
@expect_recipe
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def bisect_cmd(run, until, against, mix, backend, search, expect, expect_preset, expect_mix,
               as_json) -> None:
    """The first step whose replay differs from RUN's log, then its first differing op.
    Exits 0 only when every step 1..UNTIL was replayed and reproduced."""
    from open1b_audit.bisect import bisect

    announce = announcement(expect, expect_preset, expect_mix)
    src = _run_url(run, "all", step=until, mix=mix, announce=announce)
    run, mix = src.dir, src.mix
    try:
        log_of(run, expect)
        rep = bisect(run, until, against, search, mix=mix, backend=backend, announce=announce)
    except ERRORS as e:
        fail(e)

    def steps(ivs):
        return ", ".join(f"{a + 1}..{b}" if b > a + 1 else f"{b}" for a, b in ivs)

    def human(r):
        for line in recipe_lines(r.get("recipe"), announce):
            click.echo(line)
        fc = r.get("final_checkpoint")
        if fc is None:
            click.echo(f"no published checkpoint in steps 1..{until}: no released weights "
                       f"were compared")
        else:
            click.echo(f"published checkpoint of step {fc['step']} (the last in 1..{until}): "
                       + ("compared with the log - it is the replayed state" if fc["compared"]
                          else "NOT compared (its step was not replayed)"))
        if r["vouched"]:
            click.echo(f"steps 1..{until} of {run} all reproduce (every checkpoint interval "
                       f"replayed: {steps(r['replayed_intervals'])}): nothing to bisect")
            return
        f = r["finding"]
        if f is not None:
            first = "first differing" if r["search"] == "all" else "a differing (maybe not the first)"
            click.echo(f"{first} step: {r['step']} ({f['component']}: {f['detail']})")
        else:
            click.echo(f"the replayed steps reproduce: {steps(r['replayed_intervals'])}")
        op = r["operator"]
        if op and op.get("stage") == "optim":
            click.echo(f"first differing operator: {op['name']} (optimizer, {op['op']}, "
                       f"parameter {op['param']}, tensor {op['tensor']}) - {op['why']}")
        elif op:
            click.echo(f"first differing operator: {op['name']} (virtual rank {op['rank']}, "
                       f"micro-batch {op['mb']}, layer {op['layer']}, {op['dir']}, op "
                       f"{op['op']}) - {op['why']}")
        elif r.get("operator_unavailable"):
            click.echo(r["operator_unavailable"])
        elif f is not None:
            click.echo("the traces of that step are identical op for op")
        if r["not_replayed"]:
            click.echo(f"not replayed: steps {steps(r['not_replayed'])}")
        click.echo(f"steps 1..{until} are NOT vouched for"
                   + ("" if f is not None else " (a binary search samples intervals; "
                      "`--search all` replays every one)"))
    emit(rep, as_json, human)
    if not rep["vouched"]:
        sys.exit(1)


@main.command("fetch-step")
@click.argument("mix_url")
@click.option("--step", type=click.IntRange(min=1), required=True,
              help="The training step whose windows to fetch (from 1).")
@click.option("--out", default=None,
              help="Also write DIR/windows.npy (uint32 windows x tokens) and DIR/step.json "
                   "(this report with every document, its tokens and its proof).")
@click.option("--run", "run", type=click.Path(file_okay=False), default=None,
              help="The run directory to check against: plan with its genesis's seed, require "
                   "its mix fingerprint, compare the digest with the step's logged one.")
@expect_run_hash
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def fetch_step_cmd(mix_url, step, out, run, expect, as_json) -> None:
    """Fetch only the documents STEP of a run trained on from the mix at MIX_URL, prove
    each against its shard's Merkle root, and rebuild the step's windows and data digest;
    exits 1 naming a document that fails its proof, with nothing reported as verified.
    With --run, exits 1 when the digest is not the one RUN logged for STEP."""
    from open1b_audit.fetch import fetch_step, run_step, write_step

    if expect and not run:
        raise click.UsageError("--expect-run-hash pins the run: give --run RUN too")
    try:
        against = None
        if run:
            lines = chained(run, expect, "its data digests cannot be trusted")
            against = run_step(run, lines, step)
        data = fetch_step(mix_url, step, against)
        written = write_step(data, out) if out else []
    except ERRORS as e:
        fail(e)
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
        click.echo(f"data digest  {r['data_digest']}  (planned with seed {r['seed']})")
        if r["run"] is None:
            click.echo(f"             (compare with step {step}'s components.data in the "
                       f"run's steps.jsonl; give --run RUN: a run trained with another seed "
                       f"used other windows)")
        else:
            click.echo(f"run {run} step {step} logs {r['run']['logged_data_digest']}: "
                       f"{'MATCH' if r['run']['matches'] else 'MISMATCH'}")
        click.echo(f"documents    {r['documents']} from {r['shards']} shard(s), each proved "
                   f"against its shard's Merkle root")
        b = r["bytes_fetched"]
        parts = ", ".join(f"{k} {v:,}" for k, v in b.items() if k != "total")
        share = "" if r["fraction"] is None else f" = {r['fraction']:.2%} of"
        click.echo(f"fetched      {b['total']:,} bytes in {r['requests']} requests{share} "
                   f"the mix's {r['mix_bytes']:,} token shard bytes ({parts})")
        for p in r["written"]:
            click.echo(f"  wrote {p}")
    emit(rep, as_json, human)
    if data.matches is False:
        click.echo(f"step {step}: the data rebuilt from the mix differs from what {run} logged "
                   f"(components.data)", err=True)
        sys.exit(1)


def _register() -> None:
    from open1b_audit.crowd.cli import register as crowd_commands
    from open1b_audit.certify_cli import register as certify_commands
    from open1b_audit.site.cli import serve_cmd, site_cmd

    certify_commands(main)          # keygen, assign, coverage
    main.add_command(site_cmd)
    main.add_command(serve_cmd)
    crowd_commands(main)            # join, doctor, publish; a run URL for coverage and site


_register()


if __name__ == "__main__":
    sys.exit(main())
