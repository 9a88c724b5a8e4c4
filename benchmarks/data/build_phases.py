"""Where a build's wall time goes, by stage, on 1 and N workers: the serial stages (listing
and plan, tokenizer stage, encoder load and fork, merge, result) and the parallel one
(inputs), with each worker's busy time and the idle tail after its last input.

Same start state as ``build_throughput.py``'s pipeline rows: an output holding only the
trained tokenizer, encoders loaded afresh. The stages are timed by wrapping the pipeline's
own functions (no code of the build changes); helpers record each input's start and end
(they are forked after the wrappers are in place), with their CPU time. Best of
``--repeat`` runs by wall time.

    .venv/bin/python -m benchmarks.data.build_phases [--workers 2] [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

from benchmarks.machine import describe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    from open1b_data.formats.definition import default_mix_path, load_mix
    from open1b_data.ingest import pipeline, pool, task
    from open1b_data.ingest.tokenizer import stage

    mix = load_mix(default_mix_path())
    out = tempfile.mkdtemp(prefix="open1b-phases-")
    stage.ensure_tokenizer(mix, out, pipeline.list_all_inputs(mix))
    spans = os.path.join(out, "spans.jsonl")
    stages: dict[str, float] = {}

    def timed(mod, name: str, label: str) -> None:
        f = getattr(mod, name)

        def g(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                stages[label] = stages.get(label, 0.0) + time.perf_counter() - t
        setattr(mod, name, g)

    timed(pipeline, "list_all_inputs", "list inputs")
    timed(pipeline, "_check_plan", "plan")
    timed(stage, "ensure_tokenizer", "tokenizer stage")
    timed(pipeline, "run_jobs", "inputs (parallel)")
    timed(pipeline, "merge", "merge")
    # the pool calls the task's functions by the names it imported (ingest/pool.py)
    timed(pool, "encoders", "load encoders")
    timed(pool, "_warm_up", "imports")
    build = pool.build_input

    def build_input(job, report=None):
        t, c = time.time(), time.process_time()
        try:
            return build(job, report)
        finally:
            with open(spans, "a") as f:
                f.write(json.dumps([os.getpid(), t, time.time(), time.process_time() - c,
                                    job.source, job.index]) + "\n")
    pool.build_input = build_input

    print(describe())
    for workers in sorted({1, args.workers}):
        best = None
        for _ in range(args.repeat):
            for name in os.listdir(out):
                if name not in ("tokenizer.json", "_work"):
                    p = os.path.join(out, name)
                    shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
            shutil.rmtree(os.path.join(out, "_work", "inputs"), ignore_errors=True)
            if os.path.exists(spans):
                os.unlink(spans)
            task.forget_encoders()
            stages.clear()
            t0, w0 = time.perf_counter(), time.time()
            pipeline.build_mix(mix, out, pipeline.BuildOptions(workers=workers, progress=False))
            wall = time.perf_counter() - t0
            if best is None or wall < best[0]:
                rows = [json.loads(x) for x in open(spans)]
                best = (wall, dict(stages), rows, w0)
        wall, st, rows, w0 = best
        busy: dict[int, float] = {}
        cpu: dict[int, float] = {}
        last: dict[int, float] = {}
        for pid, a, b, c, _, _ in rows:
            busy[pid] = busy.get(pid, 0.0) + b - a
            cpu[pid] = cpu.get(pid, 0.0) + c
            last[pid] = max(last.get(pid, 0.0), b)
        end = max(last.values())
        print(f"\n{workers} worker(s): wall {wall:.3f} s (best of {args.repeat})")
        for k, v in st.items():
            print(f"  {k:<20} {v:.3f} s")
        serial = wall - st.get("inputs (parallel)", 0.0)
        print(f"  {'outside inputs':<20} {serial:.3f} s ({serial / wall:.0%} of the wall)")
        for pid in sorted(busy):
            print(f"  worker {pid}: busy {busy[pid]:.3f} s (CPU {cpu[pid]:.3f} s), idle after "
                  f"its last input {end - last[pid]:.3f} s")
        print(f"  inputs' CPU in all: {sum(cpu.values()):.3f} s")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
