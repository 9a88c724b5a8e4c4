"""The audit collective on a run published to S3 (moto's server on loopback): wall time of
four auditors against one, the bytes each fetches against the whole run, and the objects
the crowd writes per step.

Builds the demo mix (or takes ``--mix``), trains ``--steps`` steps of ``--preset`` (default
``demo``) with a checkpoint every ``--checkpoint-every`` steps, publishes run and mix to
``s3://bench/`` on a loopback moto server, then runs, each against a fresh store prefix:

1. one auditor (``open1b-audit join``, redundancy 1) covering the run alone - the anchor;
2. ``--auditors`` auditors at redundancy 1 sharing the same work;
3. ``--auditors`` auditors at redundancy 2.

Every auditor is its own process (``--threads`` torch threads each), started together, the
doctor's selftest skipped (its calibration runs; the selftest is a fixed ~10 s per process).
Wall time: from the first start to the last exit. Per auditor: legs and outcomes, bytes
fetched by kind, objects written by kind, claims lost to another auditor. The run's
published bytes (log, config, checkpoints) and the mix's are measured from the files.

    python -m benchmarks.audit.crowd [--preset demo] [--steps 16] [--checkpoint-every 4]
        [--leg-steps 2] [--auditors 4] [--threads 1] [--mix DIR] [--out FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.machine import RESULTS, LoadLog, describe


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _crowd(run: str, store: str, keys: list[str], work: str, env: dict, leg_steps: int,
           redundancy: int) -> tuple[float, list[dict]]:
    cmd = [sys.executable, "-m", "open1b_audit.cli", "join", run, "--store", store, "--cache",
           os.path.join(work, "caches"), "--no-selftest", "--json", "--leg-steps",
           str(leg_steps), "--redundancy", str(redundancy), "--heartbeat", "30", "--poll",
           "0.5", "--idle", "120"]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd + ["--key", k], env=env, stdout=subprocess.PIPE,
                              stderr=open(os.path.join(work, f"auditor-{i}.log"), "wb"))
             for i, k in enumerate(keys)]
    outs = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"an auditor exited {p.returncode}; see {work}/auditor-*.log")
        outs.append(json.loads(out))
    return time.perf_counter() - t0, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="demo")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument("--leg-steps", type=int, default=2)
    ap.add_argument("--auditors", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mix", default=None, help="a built mix (default: build the demo's)")
    ap.add_argument("--out", default=str(RESULTS / "results-crowd.md"))
    args = ap.parse_args()

    import torch

    from open1b_audit import certificate
    from open1b_audit.crowd.publish import publish
    from open1b_train.config import preset
    from open1b_train.train import train
    from testkit.crowd import Moto

    load = LoadLog()
    work = tempfile.mkdtemp(prefix="open1b-crowd-")
    moto = Moto()
    try:
        mix = args.mix
        if mix is None:
            from open1b_data.formats.definition import default_mix_path, load_mix
            from open1b_data.ingest.pipeline import BuildOptions, build_mix

            mix = os.path.join(work, "mix")
            build_mix(load_mix(default_mix_path()), mix, BuildOptions(workers=1, progress=False))
        torch.set_num_threads(args.threads)
        cfg = dataclasses.replace(preset(args.preset), steps=args.steps,
                                  checkpoint_every=args.checkpoint_every)
        t0 = time.perf_counter()
        train(cfg, mix, os.path.join(work, "run"), progress=False)
        train_s = time.perf_counter() - t0
        from open1b_train import runlog

        windows = {ln["step"]: ln["windows"][1] - ln["windows"][0]
                   for ln in runlog.read(os.path.join(work, "run"))[1:]}
        load.sample("trained")
        env = {**os.environ, **moto.env(), "OMP_NUM_THREADS": str(args.threads),
               "PYTHONPATH": os.getcwd()}
        env.pop("FSSPEC_S3_ENDPOINT_URL", None)
        os.environ.update(moto.env())
        os.environ.pop("FSSPEC_S3_ENDPOINT_URL", None)
        import s3fs

        s3fs.S3FileSystem(skip_instance_cache=True).mkdir("bench")
        run = "s3://bench/run"
        publish(os.path.join(work, "run"), run, "../mix", mix)
        run_bytes, mix_bytes = _size(os.path.join(work, "run")), _size(mix)
        keys = []
        for i in range(args.auditors):
            k = os.path.join(work, f"k{i}.pem")
            certificate.keygen(k)
            keys.append(k)
        results = {}
        for name, n, r in (("1 auditor, redundancy 1", 1, 1),
                           (f"{args.auditors} auditors, redundancy 1", args.auditors, 1),
                           (f"{args.auditors} auditors, redundancy 2", args.auditors, 2)):
            sub = os.path.join(work, name.replace(" ", "-").replace(",", ""))
            os.makedirs(sub)
            wall, outs = _crowd(run, f"s3://bench/audit-{len(results)}", keys[:n], sub, env,
                                args.leg_steps, r)
            results[name] = (wall, outs, r)
            load.sample(name)
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)
    anchor = results["1 auditor, redundancy 1"][0]
    rows = []
    for name, (wall, outs, r) in results.items():
        fetched = [o["bytes_fetched"]["total"] for o in outs]
        objs = sum(o["store"]["objects_created"] for o in outs)
        kinds: dict[str, int] = {}
        for o in outs:
            for k, v in o["store"]["objects_by_kind"].items():
                kinds[k] = kinds.get(k, 0) + v
        steps = sorted({s for o in outs for s in o["steps_certified"]})
        rows.append(
            f"| {name} | **{wall:.1f}** | {anchor / wall:.2f}x | {len(steps)} x {r} | "
            f"{', '.join(str(len(o['legs'])) for o in outs)} | "
            f"{', '.join(f'{b / 2**20:.1f}' for b in fetched)} | "
            f"{max(fetched) / (run_bytes + mix_bytes):.1%} | "
            f"{objs} ({objs / args.steps:.1f}/step: "
            + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ") | "
            f"{sum(o['claims_lost'] for o in outs)} | "
            f"{sum(o['store']['bytes_written'] for o in outs) / 2**20:.1f} |")
    one = results["1 auditor, redundancy 1"][1][0]
    # the doctor's estimate of the largest step against the steps of that size it replayed
    est = one["doctor"]["step"]
    took = sorted(t for x in one["legs"] for s, t in x["step_seconds"].items()
                  if windows[int(s)] == est["windows"])
    doctor_line = (f"- the doctor's estimate of a {est['windows']}-window step: "
                   f"{est['seconds']:.2f} s; the one auditor replayed {len(took)} such steps in "
                   f"{took[len(took) // 2]:.2f} s (median; {took[0]:.2f}-{took[-1]:.2f}; a "
                   f"leg's first step includes its setup): measured / estimated "
                   f"{took[len(took) // 2] / est['seconds']:.2f}" if took else
                   "- the doctor's estimate: no step of its size was replayed")
    text = [
        "# The audit collective (benchmarks/audit/crowd.py)", "",
        f"- command: `python -m benchmarks.audit.crowd --preset {args.preset} --steps "
        f"{args.steps} --checkpoint-every {args.checkpoint_every} --leg-steps {args.leg_steps} "
        f"--auditors {args.auditors} --threads {args.threads}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {describe()}",
        f"- {load.summary()}",
        f"- run: preset {args.preset}, {args.steps} steps (trained in {train_s:.1f} s, "
        f"{args.threads} thread(s)), checkpoints every {args.checkpoint_every}; published "
        f"run {run_bytes / 2**20:.1f} MiB (log, config, checkpoints), mix "
        f"{mix_bytes / 2**20:.1f} MiB; store and run on moto's S3 server on loopback",
        "- one auditor's bytes by kind: " + ", ".join(
            f"{k} {v:,}" for k, v in one["bytes_fetched"].items()),
        doctor_line, "",
        "| configuration | wall s | vs 1 auditor | steps x certificates | legs per auditor | "
        "MiB fetched per auditor | most fetched / run + mix | objects written | claims "
        "lost | MiB written |",
        "|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    with open(args.out, "w") as f:
        f.write("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
