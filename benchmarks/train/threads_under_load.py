"""Threads under load: the demo preset's training and generation on every core, with
OpenMP's spinning waits (libgomp's default) and with passive waits (what the command-line
tools set, open1b/cli.py), against one thread - on an idle machine and with ``--busy N``
cores kept busy by other processes (a plain spinning loop each, as another user's job).

Each configuration runs the real commands in a subprocess (``open1b-train run --preset demo
--steps S`` on the demo mix, then ``open1b-train generate``), alternating the configurations
``--repeats`` times; the report gives each one's median wall time and its ratio to one
thread in the same condition. The bits do not depend on the threads (the run hash of every
configuration is compared).

    .venv/bin/python -m benchmarks.train.threads_under_load --mix build/demo-mix --busy 0,1
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.machine import cores, report_end, report_head

CONFIGS = {          # name -> environment
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "all cores, spinning waits": {"OMP_WAIT_POLICY": "ACTIVE"},
    "all cores, passive waits": {"OMP_WAIT_POLICY": "PASSIVE"},
}


def _spin() -> None:
    while True:
        pass


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr.strip()}")
    return time.perf_counter() - t0, p.stdout


def run_config(name: str, mix: str, steps: int, work: str) -> tuple[float, float, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(CONFIGS[name])
    out = os.path.join(work, name.replace(" ", "_").replace(",", ""))
    exe = os.path.join(os.path.dirname(sys.executable), "open1b-train")
    train_s, _ = _timed([exe, "run", "--preset", "demo", "--mix", mix, "--steps", str(steps),
                         "--out", out, "--quiet"], env)
    gen_s, text = _timed([exe, "generate", out, "--prompt", "The electric field of",
                          "--max-tokens", "40", "--json"], env)
    run_hash = json.loads(text)["run_hash"]
    subprocess.run(["rm", "-rf", out], check=True)
    return train_s, gen_s, run_hash


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mix", default="build/demo-mix")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--busy", default="0,1", help="Comma-separated counts of busy cores.")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    lines = report_head("python -m benchmarks.train.threads_under_load " + " ".join(sys.argv[1:]))
    lines += ["", f"{a.steps} demo steps (`open1b-train run`) and 40 generated tokens "
              f"(`open1b-train generate`), {cores()} usable cores; median of {a.repeats} "
              f"alternating runs; ratio = one thread's time / this one's (above 1: faster)", "",
              "| busy cores | configuration | train s | x 1 thread | generate s | x 1 thread |",
              "|---|---|---|---|---|---|"]
    hashes = set()
    for busy in [int(b) for b in a.busy.split(",")]:
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
        for p in spinners:
            p.start()
        try:
            times: dict[str, list[tuple[float, float]]] = {n: [] for n in CONFIGS}
            with tempfile.TemporaryDirectory() as work:
                for _ in range(a.repeats):
                    for name in CONFIGS:
                        tr, ge, h = run_config(name, a.mix, a.steps, work)
                        times[name].append((tr, ge))
                        hashes.add(h)
                        print(f"busy {busy} {name}: train {tr:.1f} s, generate {ge:.1f} s",
                              flush=True)
        finally:
            for p in spinners:
                p.terminate()
        base_t = statistics.median(t for t, _ in times["1 thread"])
        base_g = statistics.median(g for _, g in times["1 thread"])
        for name, ts in times.items():
            mt = statistics.median(t for t, _ in ts)
            mg = statistics.median(g for _, g in ts)
            lines.append(f"| {busy} | {name} | {mt:.1f} | {base_t / mt:.2f}x | {mg:.1f} | "
                         f"{base_g / mg:.2f}x |")
    lines.append(f"\nrun hashes: {'all equal' if len(hashes) == 1 else 'DIFFER: ' + str(hashes)}")
    report_end(lines, a.out)


if __name__ == "__main__":
    main()
