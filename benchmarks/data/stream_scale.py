"""The stream's plan at Open-1B scale, without the data.

Writes a synthetic built mix with the Table-5 document counts (332.2M documents, log-normal
lengths per source, shards of 1e5 documents = per-input-file shards), then measures, each
stage in a fresh subprocess so peak memory (ru_maxrss) is per stage:
  1. cold plan: window range of step 80957 with no index (replays the stream vectorized);
  2. seek-index build over the whole schedule (~97.7M windows), time and peak memory;
  3. `stream-at --step 80957` plan-only latency with the index (open mix + index, plan the
     step's windows), repeated; and the real CLI when it exists.
Results go to benchmarks/results/results-stream-scale.md (appended by hand from this output).

    .venv/bin/python -m benchmarks.data.stream_scale [--scale 1.0] [--out benchmarks/out/o1b]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from benchmarks.machine import REPO

OPEN1B_SCHEDULE = {
    "seq_tokens": 4096, "micro_batch": 4, "reference_world": 48,
    "phases": [{"start_tokens": 0, "batch_sequences": 768},
               {"start_tokens": 4_000_000_000, "batch_sequences": 1152},
               {"start_tokens": 360_000_000_000, "batch_sequences": 2304}],
    "stop_tokens": 400_000_000_000, "lr_peak": 4.5e-4, "lr_final_ratio": 0.1,
    "warmup_tokens": 667 * 768 * 4096}


def step_windows(step: int, sched: dict = OPEN1B_SCHEDULE) -> tuple[int, int]:
    """[first, end) windows of a step by the SPEC 3 rule (a plain loop: reference only)."""
    first, tokens = 0, 0
    for s in range(1, step + 1):
        b = [p for p in sched["phases"] if p["start_tokens"] <= tokens][-1]["batch_sequences"]
        if s == step:
            return first, first + b
        first += b
        tokens += b * sched["seq_tokens"]
    raise ValueError(step)


def digest(segs) -> str:
    import hashlib

    h = hashlib.sha256()
    for f in ("window", "draw", "source", "shard", "doc", "epoch", "doc_start", "length",
              "window_offset"):
        h.update(getattr(segs, f).astype("<i8").tobytes())
    return h.hexdigest()


def anchor(out: str, first_window: int) -> dict:
    """The SPEC's "numpy sketch" as an anchor, run on the same files: numpy's own generator
    (not reproducible across versions, no exact weights, no seeking) draws the sources,
    np.random permutes each shard, lengths are gathered and cumulated until the window.
    The lower bound of what a vectorized plan costs with the same data volume."""
    import numpy as np

    from open1b_data.stream.mixview import MixView

    view = MixView.open(out)
    g = np.random.default_rng(42)
    p = np.array(view.weights, dtype=np.float64)
    p /= p.sum()
    target = first_window * view.window
    pos, draws = 0, 0
    cursors = [[0, 0] for _ in view.sources]   # shard, offset into it
    perms: dict = {}
    while pos <= target:
        n = 1 << 22
        src = g.choice(len(p), size=n, p=p)
        lens = np.empty(n, dtype=np.int64)
        for s, sv in enumerate(view.sources):
            idx = np.flatnonzero(src == s)
            got, k = [], idx.size
            while k:
                h, off = cursors[s]
                if (s, h) not in perms:
                    perms = {(s, h): view.lengths(s, h)[g.permutation(sv.shard_documents[h])]}
                take = perms[(s, h)][off:off + k]
                got.append(take)
                k -= take.size
                cursors[s] = ([h, off + take.size] if off + take.size < sv.shard_documents[h]
                    else [(h + 1) % sv.shards, 0])
            if idx.size:
                lens[idx] = np.concatenate(got)
        c = np.cumsum(lens + 1)
        if pos + c[-1] > target:
            draws += int(np.searchsorted(c, target - pos, side="right"))
            break
        pos += int(c[-1])
        draws += n
    return {"anchor_draws": draws}


def stage(name: str, out: str, step: int) -> dict:
    from open1b_data.stream import seekindex
    from open1b_data.stream.plan import StreamPlan

    a, b = step_windows(step)
    res: dict = {"stage": name, "step": step, "windows": [a, b]}
    t0 = time.perf_counter()
    if name == "cold":
        plan = StreamPlan.open(out, use_index=False)
        segs = plan.segments_range(a, b)
        res["segments"] = len(segs)
        res["digest"] = digest(segs)
    elif name == "index":
        plan = StreamPlan.open(out, use_index=False)
        idx = seekindex.build(plan)
        seekindex.save(idx, out)
        res["entries"], res["every"], res["covered"] = len(idx.draw), idx.every, idx.windows
    elif name == "warm":
        times = []
        for _ in range(5):
            t = time.perf_counter()
            plan = StreamPlan.open(out)
            assert plan.index is not None
            segs = plan.segments_range(a, b)
            times.append(time.perf_counter() - t)
        res["latencies_s"] = times
        res["segments"] = len(segs)
        res["digest"] = digest(segs)
        from open1b_data.stream.mixview import MixView

        t = time.perf_counter()
        MixView.open(out)
        res["open_mix_full_manifest_check_s"] = time.perf_counter() - t
    elif name == "anchor":
        res.update(anchor(out, a))
    res["seconds"] = time.perf_counter() - t0
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--out", default="benchmarks/out/open1b-synthetic")
    ap.add_argument("--step", type=int, default=80957)
    ap.add_argument("--stage", default=None)
    ap.add_argument("--only", default="cold,index,warm,anchor",
                    help="stages to run, comma-separated")
    args = ap.parse_args()
    if args.stage:
        print(json.dumps(stage(args.stage, args.out, args.step)))
        return
    from testkit.synthetic import open1b_sources, write_synthetic_mix

    if not os.path.exists(os.path.join(args.out, "manifest.json")):
        t = time.perf_counter()
        fp = write_synthetic_mix(args.out, open1b_sources(args.scale), seed=42, window=4097,
                                 name="open1b-synthetic", schedule=OPEN1B_SCHEDULE)
        print(json.dumps({"stage": "write", "seconds": time.perf_counter() - t,
                          "fingerprint": fp}), flush=True)
    results = []
    for name in args.only.split(","):
        r = subprocess.run([sys.executable, "-m", __spec__.name, "--stage", name, "--out", args.out,
                            "--step", str(args.step)], capture_output=True, text=True)
        if r.returncode:
            print(r.stderr, file=sys.stderr)
            raise SystemExit(f"stage {name} failed")
        results.append(json.loads(r.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    # The real CLI, plan only (the synthetic mix has no token shards). Run as
    # `python -c "from open1b_data.cli import main; main()"` from the repository root, which
    # is what the `open1b-data` entry point runs.
    root = str(REPO)
    cmd = [sys.executable, "-c", "import sys; sys.argv[0] = 'open1b-data'; "
           "from open1b_data.cli import main; main()", "stream-at", args.out, "--step",
           str(args.step), "--plan-only", "--json"]
    for _ in range(3):
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
        res = {"stage": "cli", "rc": r.returncode, "seconds": time.perf_counter() - t,
               "stdout_bytes": len(r.stdout), "stderr_tail": r.stderr[-300:]}
        if r.returncode == 0:
            out = json.loads(r.stdout)
            res["windows"] = len(out["windows"])
            res["segments"] = sum(len(w["segments"]) for w in out["windows"])
        print(json.dumps(res), flush=True)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import numpy, click, open1b_data.cli"],
                   capture_output=True, cwd=root)
    print(json.dumps({"stage": "python+imports", "seconds": time.perf_counter() - t}))


if __name__ == "__main__":
    main()
