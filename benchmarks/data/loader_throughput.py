"""Loader throughput from local shards vs a raw sequential read of the same shard files.

What it measures (same process, same files, same run, alternating):
  raw    - every token shard read front to back the way a plain user would:
           ``pyarrow.parquet.read_table(path, columns=["tokens"])`` (Arrow's defaults,
           threads on), the column flattened to one uint32 numpy array per shard. The floor
           cost of getting tokens off disk; no check, no plan, no packing.
  loader - ``StreamLoader(rank 0 of 1)`` yielding int64 ``input_ids``/``labels`` micro-batches
           (every shard checked by content: all four columns decoded, every document's
           Merkle leaf - tokens and provenance - hashed and the tree's root compared with
           the manifest's, the held-out rule applied to every doc_id; plan, window
           assembly, tensor conversion; its threads on) until it has delivered as many
           tokens as the raw side read.
Both sides cover ``--passes`` (3) times the mix's tokens: the raw side reads every shard that
often, the loader runs through ~3 epochs of every source, decoding each shard about once
per epoch (whole-shard cache) - the steady state of training.
Tokens count 4,097 per window (what the stream delivers). Both are reported per wall second
and per CPU second of the process (``time.process_time``: all threads, i.e. per core busy).
The 1-minute load average is printed before, between and after the two sides: figures
taken while other jobs share the cores say less (both sides lose CPU, and the scheduler
shares it per thread, so the multi-threaded loader loses less than the anchor). Goal: loader
>= 0.5x the raw read in tokens per wall second, with the check on, on an idle machine.

Run:  .venv/bin/python -m benchmarks.data.loader_throughput [--tokens 60e6] [--out DIR]
Results go to benchmarks/results/results-loader.md (written by hand from this script's output).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
import time

import numpy as np
import pyarrow.parquet as pq

from benchmarks.machine import cores, cpu_model
from open1b_data.stream.loader import StreamLoader
from open1b_data.stream.plan import StreamPlan
from testkit.synthetic import SyntheticSource, write_synthetic_mix

WINDOW = 4097


def schedule(total_windows: int) -> dict:
    return {"seq_tokens": WINDOW - 1, "micro_batch": 4, "reference_world": 1,
            "phases": [{"start_tokens": 0, "batch_sequences": 64}],
            "stop_tokens": total_windows * (WINDOW - 1), "lr_peak": 1e-3,
            "lr_final_ratio": 0.1, "warmup_tokens": 0}


def build(out: str, tokens: float) -> None:
    # Mix-0626 proportions and mean lengths; ~3M-token shards, so the mix has ~20 shards:
    # many more than the loader's cache holds (see loader_read), as at real scale.
    table = [("dclm-baseline", 0.667, 1252, 1.0), ("fineweb-edu", 0.133, 1005, 0.9),
             ("the-stack-v2", 0.120, 1978, 1.3), ("proof-pile-2", 0.080, 6743, 1.4)]
    srcs = [SyntheticSource(n, max(1, round(tokens * share / mean)), mean, sigma,
                            docs_per_shard=max(1, round(3e6 / mean)))
            for n, share, mean, sigma in table]
    write_synthetic_mix(out, srcs, window=WINDOW, token_shards=True, vocab=50000,
                        schedule=schedule(int(tokens * 6) // WINDOW // 64 * 64))


def raw_read(plan: StreamPlan, passes: int = 1) -> tuple[int, float, float]:
    files = [plan.view.url(p) for s in plan.view.sources for p in s.shard_paths] * passes
    t, c = time.perf_counter(), time.process_time()
    n = 0
    for f in files:
        col = pq.read_table(f, columns=["tokens"]).column("tokens").combine_chunks()
        flat = col.values.to_numpy(zero_copy_only=False)
        n += int(np.ascontiguousarray(flat, dtype=np.uint32).size)
    return n, time.perf_counter() - t, time.process_time() - c


def loader_read(plan: StreamPlan, windows: int) -> tuple[int, float, float]:
    # One cached shard per source: each source reads its shards one at a time, so every
    # shard is decoded once per epoch and nothing survives into the next epoch.
    ld = StreamLoader(plan, rank=0, world=1, prefetch=8, cache_shards=1)
    if len(ld) * 4 < windows:
        raise SystemExit(f"the mix's schedule has {len(ld) * 4} windows, fewer than {windows}")
    t, c = time.perf_counter(), time.process_time()
    n = 0
    for item in ld:
        n += int(item["input_ids"].shape[0]) * WINDOW
        if n >= windows * WINDOW:
            break
    return n, time.perf_counter() - t, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=float, default=60e6, help="Total tokens in the mix.")
    ap.add_argument("--out", default=None, help="Mix directory (kept; default: a temp dir).")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--passes", type=int, default=3,
                    help="Raw: read every shard this many times; loader: as many tokens "
                         "(several epochs, so both sides decode each shard about once per "
                         "pass - the steady state of training).")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="loader-bench-")
    if not os.path.exists(os.path.join(out, "manifest.json")):
        t = time.perf_counter()
        build(out, args.tokens)
        print(json.dumps({"stage": "write mix", "seconds": round(time.perf_counter() - t, 1)}))
    import pyarrow
    import torch

    info = {"machine": cpu_model(), "cpus": cores(),
            "python": platform.python_version(), "numpy": np.__version__,
            "pyarrow": pyarrow.__version__, "torch": torch.__version__}
    print(json.dumps(info))
    raw_read(StreamPlan.open(out))         # warm the page cache: both sides read warm files
    runs = []
    for i in range(args.repeat):
        plan = StreamPlan.open(out)
        load = [os.getloadavg()[0]]
        n_raw, w_raw, c_raw = raw_read(plan, args.passes)
        load.append(os.getloadavg()[0])
        windows = n_raw // WINDOW               # the loader delivers the same token count
        n_ld, w_ld, c_ld = loader_read(StreamPlan.open(out), windows)
        load.append(os.getloadavg()[0])
        rep = {"run": i, "utc": datetime.datetime.now(datetime.timezone.utc).strftime(
                   "%Y-%m-%d %H:%M"), "load1_before_raw_loader_after": load,
               "raw_tokens": n_raw, "raw_Mtok_per_s": n_raw / w_raw / 1e6,
               "raw_Mtok_per_cpu_s": n_raw / c_raw / 1e6, "loader_tokens": n_ld,
               "loader_Mtok_per_s": n_ld / w_ld / 1e6,
               "loader_Mtok_per_cpu_s": n_ld / c_ld / 1e6,
               "ratio_wall": (n_ld / w_ld) / (n_raw / w_raw),
               "ratio_cpu": (n_ld / c_ld) / (n_raw / c_raw)}
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                          for k, v in rep.items()}), flush=True)
        runs.append(rep)
    med = {k: round(float(np.median([r[k] for r in runs])), 3) for k in runs[0]
           if k.endswith(("_s", "_wall", "_cpu"))}
    print(json.dumps({"median_of": len(runs), **med}))


if __name__ == "__main__":
    main()
